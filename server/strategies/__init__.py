"""The loop builds its strategy from the registry of methods (``common/methods``)."""

from __future__ import annotations

from common.config import ExperimentConfig
from common.methods import METHODS, adapter, core

from .base import Incoming, Outgoing, PriorReleases, StepOutcome, Strategy


def build_strategy(
    cfg: ExperimentConfig, num_classes: int, state_dir: str, prior: PriorReleases | None = None
) -> Strategy:
    """The strategy of ``cfg.strategy``; ``prior`` releases only for a method whose core accepts them."""
    method = core(cfg.strategy)
    strategy_cls = adapter(METHODS[cfg.strategy].strategy)
    if prior is None:
        return strategy_cls(cfg, num_classes, state_dir)
    if not method.ACCEPTS_PRIOR_RELEASES:
        raise ValueError(f"{cfg.strategy} cannot account for releases made before its run")
    return strategy_cls(cfg, num_classes, state_dir, prior=prior)


__all__ = ["Incoming", "Outgoing", "PriorReleases", "StepOutcome", "Strategy", "build_strategy"]
