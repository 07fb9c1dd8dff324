"""GS-WGAN's secure-sum plan (``secure.py`` says how a step's answers are summed): what one answer is
as a vector, its clip, the step's cohort and survivors, and the sum's noise. Apart from the answer
itself so that the privacy module, which calibrates and states the plan, needs nothing that answers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from common.privacy import query_noise_multiplier
from common.secagg.plan import SecureSumPlan, plan_with_multiplier
from common.secagg.plan import fewest_survivors as _fewest

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


def fewest_survivors(cfg: ExperimentConfig) -> int:
    """t of a step's sum over its m clients (``--secagg-threshold``, or ⌈2m/3⌉)."""
    return _fewest(cfg.clients_per_step, cfg.secagg_threshold)


def coords(cfg: ExperimentConfig) -> int:
    """Coordinates of one sample's gradient as released (DCT coefficients or pixels)."""
    return cfg.grad_dct**2 if cfg.grad_dct else 28 * 28


def plan(cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> SecureSumPlan:
    """B rows of ``coords`` clipped to C each (the answer's norm ≤ C√B), cohort m, survivors t, the
    sum's noise multiplier σ/√B (or ``noise_multiplier`` per answer)."""
    B = cfg.batch_size
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=B)
    nm = nm if noise_multiplier is None else noise_multiplier
    return plan_with_multiplier(
        dim=B * coords(cfg),
        clip=cfg.clip * math.sqrt(B),
        cohort=cfg.clients_per_step,
        threshold=fewest_survivors(cfg),
        sigma=nm,
        colluders=cfg.secagg_colluders,
    )
