"""Release channels: how a method's release leaves a client, is noised, summed and accounted
(``spec.py`` has the contract). A method describes its release (``ReleaseSpec``); the run's channel
(``channel_for``) does the rest:

- ``local`` (``local.py``, the default): each release in the clear, with its client's own noise;
- ``secure-sum`` (``secure_sum.py``, ``--secure-aggregation``): each release deposited on its node
  with a Skellam share, only SecAgg+ sums revealed (``secure_server.py``: the server's records; the
  protocol's math, messages and plan in ``common/secagg``, its drivers beside the shells).

A new channel is one module and one ``register_channel`` call (a test registers a toy one from its
folder); no method names a channel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from common.options import check
from common.privacy import PrivacyEvent, PrivacyLedger

from .local import LocalChannel
from .secure_sum import SecureSumChannel
from .spec import NOISE, SUMS, ReleaseChannel, ReleaseSpec

CHANNELS: dict[str, ReleaseChannel] = {c.name: c for c in (LocalChannel(), SecureSumChannel())}


def register_channel(channel: ReleaseChannel) -> None:
    """Make ``channel`` selectable as ``--release-channel <its name>``."""
    if not isinstance(channel, ReleaseChannel):
        raise TypeError(f"{channel!r} does not satisfy the ReleaseChannel contract (common/channels/spec.py)")
    CHANNELS[channel.name] = channel


def channel_name(cfg: Any) -> str:
    """The run's channel: ``--release-channel``, or ``secure-sum`` for ``--secure-aggregation``."""
    return cfg.release_channel or ("secure-sum" if cfg.secure_aggregation else "local")


def checked_channel(cfg: Any) -> ReleaseChannel:
    """The run's channel, once its options are checked (a ConfigError naming the field otherwise)."""
    check(
        not (cfg.secure_aggregation and cfg.release_channel not in ("", "secure-sum")),
        "release_channel",
        cfg.release_channel,
        "contradicts secure_aggregation = true (which picks secure-sum): give one of them",
    )
    name = channel_name(cfg)
    check(name in CHANNELS, "release_channel", name, f"choose one of {', '.join(CHANNELS)}")
    return CHANNELS[name]


def channel_for(cfg: Any) -> ReleaseChannel:
    """The run's channel object (a KeyError naming the known ones for an unknown name; the
    configuration's check says it first)."""
    name = channel_name(cfg)
    if name not in CHANNELS:
        raise KeyError(f"release channel {name!r} is not registered; choose one of {', '.join(CHANNELS)}")
    return CHANNELS[name]


def epsilon_after(
    channel: ReleaseChannel, cfg: Any, spec: ReleaseSpec, releases: int, prior: Sequence[PrivacyEvent] = ()
) -> float:
    """The per-client ε of ``releases`` releases through ``channel`` after the client's ``prior``
    ones (a seed release): the channel's own figure when there are none, else one ledger composing
    both (the channel's event, ``releases`` times, beside them), as the client's ledger will."""
    if not prior:
        return channel.epsilon(cfg, spec, releases)
    event = channel.events(cfg, spec)[0]
    return PrivacyLedger([*prior, dataclasses.replace(event, count=event.count * releases)]).epsilon(delta=cfg.delta)


__all__ = [
    "CHANNELS",
    "NOISE",
    "SUMS",
    "ReleaseChannel",
    "ReleaseSpec",
    "channel_for",
    "channel_name",
    "checked_channel",
    "epsilon_after",
    "register_channel",
]
