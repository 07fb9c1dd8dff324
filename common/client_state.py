"""A client's private state, as plain data: D_k, its Adam moments, the ledger, the data cursor, the partition.

Framework-free, so that a method's client-side computation works on it directly; ``client/state.py``
keeps it on the node's disk between messages and caches recent ones. Whether a client keeps a
private D is its method's to say (handed in as the learning rate of D's Adam).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from common.data import (
    ClientData,
    client_arrays,
    client_data_from_arrays,
    num_classes_for,
    partition_key,
)
from common.device import resolve_device
from common.learning.dpac import build_classifier, classifier_adam
from common.learning.models import build_discriminator
from common.privacy import PrivacyLedger

if TYPE_CHECKING:
    from common.run_options import RunOptions


@dataclass
class ClientState:
    client_id: int
    discriminator: torch.nn.Module | None  # None for a method whose clients keep none
    optimizer: torch.optim.Optimizer | None
    ledger: PrivacyLedger
    data_rng: torch.Generator
    data: ClientData
    version: int = 0
    warmed_up: bool = False
    data_key: str = ""  # ``partition_key`` of the config ``data`` was made under
    packed_data: dict[str, Any] | None = field(default=None, repr=False)  # ``data`` as the file stores it
    # DPAC (``common/learning/dpac.py``): the client's private auxiliary classifier C_k and its Adam, or None
    classifier: torch.nn.Module | None = None
    classifier_optimizer: torch.optim.Optimizer | None = None
    classifier_ready: bool = False  # its init on real data (``dpac_init``) has run
    # Through secure sums, each release's guarantee against a server that deviates (the client's own
    # noise share), composed over every run on this state, as ``ledger`` composes the protocol's.
    own_ledger: PrivacyLedger = field(default_factory=PrivacyLedger)


def adam_for(cfg: RunOptions, disc: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(disc.parameters(), lr=lr, betas=(cfg.beta1, cfg.beta2))


def classifier_for(cfg: RunOptions) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None]:
    """A fresh DPAC classifier and its Adam on the run's device, or (None, None) when DPAC is off."""
    if cfg.dpac_beta >= 1:
        return None, None
    C = build_classifier(cfg.model, num_classes=num_classes_for(cfg)).to(resolve_device(cfg.device))
    return C, classifier_adam(C, cfg.dpac_lr)


def _data_rng(cfg: RunOptions, client_id: int) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 7_919 + client_id)


def client_seed(cfg: RunOptions, client_id: int) -> int:
    """The public seed of a client's initial weights (its D; offset, its warm start's throwaway G)."""
    return cfg.seed * 1_000_003 + client_id


def new_state(cfg: RunOptions, client_id: int, *, critic_lr: float | None = None) -> ClientState:
    """A fresh client: empty ledger, data cursor seeded, and, when its method keeps a private D
    (``critic_lr``: the learning rate of its Adam; None: none, as DP-MERF's clients, for which one
    per client would cost ~50 ms and 400 kB of disk each in a 3,400-client federation), D
    initialised from a per-client seed."""
    torch.manual_seed(client_seed(cfg, client_id))
    disc = None
    if critic_lr is not None:
        disc = build_discriminator(cfg.model, num_classes=num_classes_for(cfg)).to(resolve_device(cfg.device))
    classifier, classifier_optimizer = classifier_for(cfg)
    images, labels, inverted = client_arrays(cfg, client_id)
    return ClientState(
        client_id=client_id,
        discriminator=disc,
        optimizer=None if disc is None or critic_lr is None else adam_for(cfg, disc, critic_lr),
        ledger=PrivacyLedger(),
        data_rng=_data_rng(cfg, client_id),
        data=client_data_from_arrays(images, labels, client_id=client_id, inverted=inverted),
        data_key=partition_key(cfg),
        classifier=classifier,
        classifier_optimizer=classifier_optimizer,
    )
