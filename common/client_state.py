"""A client's private state, as plain data: D_k, its Adam moments, the ledger, the data cursor, the partition.

Framework-free, so that a method's client-side computation (``common/methods/``) works on it
directly; ``client/state.py`` keeps it on the node's disk between messages and caches recent ones.
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
from common.dpac import build_classifier, classifier_adam
from common.methods import core
from common.models import build_discriminator
from common.privacy import PrivacyLedger

if TYPE_CHECKING:  # a type only: common.config imports the methods, which import this module
    from common.config import ExperimentConfig


@dataclass
class ClientState:
    client_id: int
    discriminator: torch.nn.Module | None  # None for a method whose clients keep none (``CLIENT_DISCRIMINATOR``)
    optimizer: torch.optim.Optimizer | None
    ledger: PrivacyLedger
    data_rng: torch.Generator
    data: ClientData
    version: int = 0
    warmed_up: bool = False
    data_key: str = ""  # ``partition_key`` of the config ``data`` was made under
    packed_data: dict[str, Any] | None = field(default=None, repr=False)  # ``data`` as the file stores it
    # DPAC (``common/dpac.py``): the client's private auxiliary classifier C_k and its Adam, or None
    classifier: torch.nn.Module | None = None
    classifier_optimizer: torch.optim.Optimizer | None = None
    classifier_ready: bool = False  # its init on real data (``dpac_init``) has run


def adam_for(cfg: ExperimentConfig, disc: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(disc.parameters(), lr=cfg.lr_d, betas=(cfg.beta1, cfg.beta2))


def classifier_for(cfg: ExperimentConfig) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None]:
    """A fresh DPAC classifier and its Adam on the run's device, or (None, None) when DPAC is off."""
    if cfg.dpac_beta >= 1:
        return None, None
    C = build_classifier(cfg.model, num_classes=num_classes_for(cfg)).to(resolve_device(cfg.device))
    return C, classifier_adam(C, cfg.dpac_lr)


def _data_rng(cfg: ExperimentConfig, client_id: int) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 7_919 + client_id)


def keeps_discriminator(cfg: ExperimentConfig) -> bool:
    """Whether the run's method keeps a private D on each client (DP-MERF's clients keep none:
    building one per client would cost ~50 ms and 400 kB of disk each in a 3,400-client federation)."""
    return getattr(core(cfg.strategy), "CLIENT_DISCRIMINATOR", True)


def client_seed(cfg: ExperimentConfig, client_id: int) -> int:
    """The public seed of a client's initial weights (its D; offset, its warm start's throwaway G)."""
    return cfg.seed * 1_000_003 + client_id


def new_state(cfg: ExperimentConfig, client_id: int) -> ClientState:
    """A fresh client: D initialised from a per-client seed (when the method keeps one), empty
    ledger, data cursor seeded."""
    torch.manual_seed(client_seed(cfg, client_id))
    disc = None
    if keeps_discriminator(cfg):
        disc = build_discriminator(cfg.model, num_classes=num_classes_for(cfg)).to(resolve_device(cfg.device))
    classifier, classifier_optimizer = classifier_for(cfg)
    images, labels, inverted = client_arrays(cfg, client_id)
    return ClientState(
        client_id=client_id,
        discriminator=disc,
        optimizer=None if disc is None else adam_for(cfg, disc),
        ledger=PrivacyLedger(),
        data_rng=_data_rng(cfg, client_id),
        data=client_data_from_arrays(images, labels, client_id=client_id, inverted=inverted),
        data_key=partition_key(cfg),
        classifier=classifier,
        classifier_optimizer=classifier_optimizer,
    )
