"""Strategy registry: the loop builds strategies by name, so a new one is one entry here."""

from __future__ import annotations

import importlib

from common.config import ExperimentConfig

from .base import Incoming, Outgoing, StepOutcome, Strategy

# name -> (module, class); imported only when used, so one strategy's dependencies never
# burden another's runs.
REGISTRY = {
    "gswgan": ("server.strategies.gswgan", "GsWganStrategy"),
    "fedavg-gan": ("server.strategies.fedavg_gan", "FedAvgGanStrategy"),
    "dpgan": ("server.strategies.dpgan", "DpganStrategy"),
}


def build_strategy(cfg: ExperimentConfig, num_classes: int, state_dir: str) -> Strategy:
    if cfg.strategy not in REGISTRY:
        raise ValueError(f"strategy {cfg.strategy!r} is not implemented; choose one of {sorted(REGISTRY)}")
    module, cls = REGISTRY[cfg.strategy]
    return getattr(importlib.import_module(module), cls)(cfg, num_classes, state_dir)


__all__ = ["Incoming", "Outgoing", "StepOutcome", "Strategy", "build_strategy"]
