"""Per-client state that must survive across rounds: D_k, its Adam moments, the ledger, the data cursor.

Flower recreates the ClientApp for every message, so the state lives on the node's disk (one
compact file per client, written atomically after every answered query) and in a small in-process
LRU cache keyed by (state directory, client). ``context.state`` carries only a version number; a
cached copy is used only when its version matches, so a node whose messages land in different
worker processes never trains a stale discriminator. RAM grows with the clients active in recent
steps (the cache bound), not with the number of clients in the federation.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from common.config import ExperimentConfig
from common.data import ClientData, load_client_partition, num_classes_for
from common.models import build_discriminator
from common.privacy import PrivacyLedger

CACHE_SIZE = 32


@dataclass
class ClientState:
    client_id: int
    discriminator: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ledger: PrivacyLedger
    data_rng: torch.Generator
    data: ClientData
    version: int = 0
    warmed_up: bool = False


_CACHE: "OrderedDict[tuple[str, int], ClientState]" = OrderedDict()


def state_path(state_dir: str | Path, client_id: int) -> Path:
    return Path(state_dir) / f"client-{client_id:05d}.pt"


def new_state(cfg: ExperimentConfig, client_id: int) -> ClientState:
    """A fresh client: D initialised from a per-client seed, empty ledger, data cursor seeded."""
    torch.manual_seed(cfg.seed * 1_000_003 + client_id)
    disc = build_discriminator(cfg.model, num_classes=num_classes_for(cfg))
    optimizer = torch.optim.Adam(disc.parameters(), lr=cfg.lr_d, betas=(cfg.beta1, cfg.beta2))
    data_rng = torch.Generator().manual_seed(cfg.seed * 7_919 + client_id)
    return ClientState(
        client_id=client_id,
        discriminator=disc,
        optimizer=optimizer,
        ledger=PrivacyLedger(),
        data_rng=data_rng,
        data=load_client_partition(cfg, client_id),
    )


def save_state(state: ClientState, state_dir: str | Path) -> None:
    """Write atomically: a crash mid-write leaves the previous file intact."""
    path = state_path(state_dir, state.client_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "client_id": state.client_id,
        "version": state.version,
        "warmed_up": state.warmed_up,
        "discriminator": state.discriminator.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "ledger": state.ledger.state_dict(),
        "data_rng": state.data_rng.get_state(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    _remember(str(state_dir), state)


def load_state(cfg: ExperimentConfig, client_id: int, state_dir: str | Path, version: int) -> ClientState:
    """The client's state at ``version`` (0 and no file: a new client)."""
    key = (str(state_dir), client_id)
    cached = _CACHE.get(key)
    if cached is not None and cached.version == version:
        _CACHE.move_to_end(key)
        return cached
    path = state_path(state_dir, client_id)
    if not path.exists():
        return new_state(cfg, client_id)
    return _remember(str(state_dir), _read_state(cfg, client_id, path))


def load_ledger(cfg: ExperimentConfig, client_id: int, state_dir: str | Path, version: int) -> PrivacyLedger:
    """The client's ledger; an empty one when it never answered (no state is created for that)."""
    cached = _CACHE.get((str(state_dir), client_id))
    if cached is None and not state_path(state_dir, client_id).exists():
        return PrivacyLedger()
    return load_state(cfg, client_id, state_dir, version).ledger


def _read_state(cfg: ExperimentConfig, client_id: int, path: Path) -> ClientState:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same failure for the user
        raise RuntimeError(f"client state file {path} is unreadable ({err}); delete it to restart "
                           "this client from scratch (its ledger would be lost)") from err
    state = new_state(cfg, client_id)
    state.discriminator.load_state_dict(blob["discriminator"])
    state.optimizer.load_state_dict(blob["optimizer"])
    state.ledger = PrivacyLedger.from_state_dict(blob["ledger"])
    state.data_rng.set_state(blob["data_rng"])
    state.version = int(blob["version"])
    state.warmed_up = bool(blob["warmed_up"])
    return state


def _remember(state_dir: str, state: ClientState) -> ClientState:
    key = (state_dir, state.client_id)
    _CACHE[key] = state
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return state


def clear_cache() -> None:
    _CACHE.clear()
