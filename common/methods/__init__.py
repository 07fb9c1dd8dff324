"""The registry of methods: a name -> its slice.

A method is four files: its framework-free core (``common/methods/<name>.py``: options, math,
client-side computation, server-side update, noise calibration, privacy events, messages), a thin
Flower strategy adapter (``server/strategies/<name>.py``), a thin client handler
(``client/handlers/<name>.py``), and one line here. Everything else reaches a method through this
registry and the attributes of its core, never by comparing its name.

The adapters are named by dotted path, so ``common`` imports neither ``server`` nor ``client``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Method:
    core: str  # module: the slice's framework-free core
    strategy: str  # "module:Class": the server-side Flower strategy adapter
    handler: str  # module: the client-side handler (``ACTION``, ``handle``)


METHODS: dict[str, Method] = {
    "gswgan": Method("common.methods.gswgan", "server.strategies.gswgan:GsWganStrategy", "client.handlers.gswgan"),
    "dpgan": Method("common.methods.dpgan", "server.strategies.dpgan:DpganStrategy", "client.handlers.dpgan"),
    "fedavg-gan": Method(
        "common.methods.fedavg_gan", "server.strategies.fedavg_gan:FedAvgGanStrategy", "client.handlers.fedavg_gan"
    ),
    "dp-merf": Method("common.methods.dp_merf", "server.strategies.dp_merf:DpMerfStrategy", "client.handlers.dp_merf"),
}


def core(name: str) -> ModuleType:
    """The core module of method ``name`` (a ValueError naming the known ones otherwise)."""
    if name not in METHODS:
        raise ValueError(f"strategy {name!r} is not implemented; choose one of {', '.join(METHODS)}")
    return importlib.import_module(METHODS[name].core)


def adapter(path: str) -> object:
    """The object a ``"module:Attribute"`` path names."""
    module, _, attribute = path.partition(":")
    imported = importlib.import_module(module)
    return getattr(imported, attribute) if attribute else imported
