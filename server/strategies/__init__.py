"""Strategy registry: the loop builds strategies by name, so a new one is one entry here."""

from __future__ import annotations

from common.config import ExperimentConfig

from .base import Incoming, Outgoing, StepOutcome, Strategy


def build_strategy(cfg: ExperimentConfig, num_classes: int, state_dir: str) -> Strategy:
    from .gswgan import GsWganStrategy

    registry = {"gswgan": GsWganStrategy}
    if cfg.strategy not in registry:
        raise ValueError(f"strategy {cfg.strategy!r} is not implemented; choose one of {sorted(registry)}")
    return registry[cfg.strategy](cfg, num_classes, state_dir)


__all__ = ["Incoming", "Outgoing", "StepOutcome", "Strategy", "build_strategy"]
