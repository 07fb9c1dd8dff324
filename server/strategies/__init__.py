"""Strategy registry: the loop builds strategies by name, so a new one is one entry here."""

from __future__ import annotations

import importlib

from common.config import ExperimentConfig

from .base import Incoming, Outgoing, PriorReleases, StepOutcome, Strategy

# name -> (module, class); imported only when used, so one strategy's dependencies never
# burden another's runs.
REGISTRY = {
    "gswgan": ("server.strategies.gswgan", "GsWganStrategy"),
    "fedavg-gan": ("server.strategies.fedavg_gan", "FedAvgGanStrategy"),
    "dpgan": ("server.strategies.dpgan", "DpganStrategy"),
}


def build_strategy(cfg: ExperimentConfig, num_classes: int, state_dir: str,
                   prior: PriorReleases | None = None) -> Strategy:
    if cfg.strategy not in REGISTRY:
        raise ValueError(f"strategy {cfg.strategy!r} is not implemented; choose one of {sorted(REGISTRY)}")
    module, cls = REGISTRY[cfg.strategy]
    strategy_cls = getattr(importlib.import_module(module), cls)
    if prior is not None:
        return strategy_cls(cfg, num_classes, state_dir, prior=prior)
    return strategy_cls(cfg, num_classes, state_dir)


__all__ = ["Incoming", "Outgoing", "PriorReleases", "StepOutcome", "Strategy", "build_strategy"]
