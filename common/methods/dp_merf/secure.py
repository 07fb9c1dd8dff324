"""DP-MERF through secure sums (``--secure-aggregation``): the plan of its releases.

Each client clips its summary to S, scales it to integers of granularity γ = S/2^14, rounds it
conditionally (its norm bounded, Kairouz et al. 2021) and adds a Skellam share Sk(μ/t) per
coordinate (``common/secagg/plan.py``); the vector is deposited on the node and only a
SecAgg+ sum over its cohort of c clients is revealed (``server/secure_sum.py``), never of fewer than
t inputs. The revealed sum therefore carries at least Sk(μ): one client's whole noise instead of
each client's, so the mean the generator is fitted to carries the noise of K/t releases instead of
K. σ keeps its meaning: μ = (σ·Δ₂)²/2.

Two guarantees per client, each from its own ledger: against a server that runs the protocol (the
sum's Sk(μ); the run's ledger and headline) and against one that deviates and reads the client's
own vector (its share Sk(μ/t); beside the headline). A node's budget counts the second unless its
policy says ``trust-secure-sum = true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.data import num_classes_for
from common.secagg.plan import SecureSumPlan, plan_with_multiplier
from common.secagg.plan import fewest_survivors as _fewest

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

    from .features import FeatureFamily


def fewest_survivors(cfg: ExperimentConfig) -> int:
    """t of the run's cohorts (``--secagg-threshold``, or ⌈2c/3⌉)."""
    return _fewest(cfg.secagg_cohort, cfg.secagg_threshold)


def plan(cfg: ExperimentConfig, family: FeatureFamily, *, noise_multiplier: float | None = None) -> SecureSumPlan:
    """The run's plan: d = C·(a row of the family's features) coordinates clipped to S, cohort c,
    survivors t, and the sum's noise multiplier the run's σ (or ``noise_multiplier``)."""
    sigma = cfg.merf_noise_multiplier if noise_multiplier is None else noise_multiplier
    dim = num_classes_for(cfg) * family.row_dim(cfg)
    t, k = fewest_survivors(cfg), cfg.secagg_colluders
    return plan_with_multiplier(
        dim=dim, clip=cfg.merf_clip, cohort=cfg.secagg_cohort, threshold=t, sigma=sigma, colluders=k
    )
