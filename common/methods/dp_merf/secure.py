"""DP-MERF through secure sums (``--secure-aggregation``): the server sees only each cohort's sum.

Each client clips its summary to S, scales it to integers of granularity γ = S/2^14, rounds it
conditionally (its norm bounded, Kairouz et al. 2021) and adds a Skellam share Sk(μ/t) per
coordinate (``common/privacy/secure_release.py``); the vector is deposited on the node and only a
SecAgg+ sum over its cohort of c clients is revealed (``server/secure_sum.py``), never fewer than t
inputs. The revealed sum therefore carries at least Sk(μ): one client's whole noise instead of
each client's, so the mean the generator is fitted to carries the noise of K/t releases instead of
K. σ keeps its meaning: μ = (σ·Δ₂)²/2, so the Skellam's std is σ times its ℓ₂ sensitivity Δ₂, the
Gaussian's.

Two guarantees per client, each from its own ledger: against a server that runs the protocol (the
sum's Sk(μ); the run's ledger and headline) and against one that deviates and reads the client's
own vector (its share Sk(μ/t); beside the headline). A node's budget counts the second unless its
policy says ``trust-secure-sum = true``.
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING

import numpy as np

from common.data import num_classes_for
from common.privacy import PrivacyEvent
from common.privacy.secure_release import SecureSumPlan, encode_signed
from common.privacy.skellam import sensitivities, skellam_tail
from common.secagg import complete_degree, majority_threshold, sparse_degree

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

COMPLETE_UP_TO = 40  # cohorts up to this size use the complete graph by default (Shamir is O(c·t) per node)
RANGE_TAIL = 1e-15  # an honest coordinate leaves its declared range with at most this probability


def fewest_survivors(cfg: ExperimentConfig) -> int:
    """t: the fewest inputs a revealed sum holds; the noise shares are calibrated for t of them."""
    return cfg.secagg_threshold or math.ceil(2 * cfg.secagg_cohort / 3)


def cohorts(nodes: list[int], cfg: ExperimentConfig, rng: np.random.Generator) -> list[list[int]]:
    """``nodes`` split at random into max(1, n // c) cohorts of c to 2c - 1 (near-equal sizes)."""
    if not nodes:
        return []
    order = [nodes[i] for i in rng.permutation(len(nodes))]
    count = max(1, len(order) // cfg.secagg_cohort)
    bounds = np.linspace(0, len(order), count + 1).round().astype(int)  # node ids are 64-bit unsigned
    return [sorted(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def graph(cfg: ExperimentConfig, size: int) -> tuple[int, int]:
    """(degree, secret-sharing threshold) of a cohort of ``size``: the complete graph with threshold
    max(t, majority) for small cohorts (or when asked), else Bell et al.'s sparse k with a strict
    majority of each neighbourhood."""
    complete = complete_degree(size)
    if cfg.secagg_degree:
        degree = min(complete, cfg.secagg_degree + cfg.secagg_degree % 2) if cfg.secagg_degree < complete else complete
    else:
        degree = complete if size <= COMPLETE_UP_TO else sparse_degree(size)
    if degree == complete:
        return degree, min(size, max(majority_threshold(degree), fewest_survivors(cfg)))
    return degree, majority_threshold(degree)


def plan(cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> SecureSumPlan:
    """The run's secure-sum plan: d = C·(2D+1) coordinates clipped to S, cohort c, survivors t, and
    μ = (σ·Δ₂)²/2 for the run's σ (or ``noise_multiplier``)."""
    sigma = cfg.merf_noise_multiplier if noise_multiplier is None else noise_multiplier
    dim = num_classes_for(cfg) * (2 * cfg.merf_features + 1)
    t = fewest_survivors(cfg)
    unit = SecureSumPlan(dim, cfg.merf_clip, cfg.secagg_cohort, t, 1.0)
    _, l2 = sensitivities(unit.bound, dim)
    return SecureSumPlan(dim, cfg.merf_clip, cfg.secagg_cohort, t, max((sigma * l2) ** 2 / 2, 1e-9))


def coordinate_range(p: SecureSumPlan) -> int:
    """R: every coordinate an honest client deposits lies in [-R, R] (its rounded vector's norm
    bound, plus its noise share's tail at ``RANGE_TAIL``); what the sum's modulus is sized for."""
    return int(math.ceil(p.bound + skellam_tail(p.mu_share, RANGE_TAIL)))


def events(p: SecureSumPlan, void: str = "") -> tuple[PrivacyEvent, PrivacyEvent]:
    """(against a server that runs the protocol, against one that deviates) for one release."""
    protocol, own = p.protocol_event(), p.own_event()
    if void:
        protocol = PrivacyEvent.skellam(mu=protocol.skellam_mu, l1=protocol.l1, l2=protocol.l2, void=void)
        own = PrivacyEvent.skellam(mu=own.skellam_mu, l1=own.l1, l2=own.l2, void=void)
    return protocol, own


def client_vector(summary: np.ndarray, p: SecureSumPlan, noise_seed: int, client_id: int, step: int) -> np.ndarray:
    """The client's deposit: its summary encoded for the sum (clipped, rounded, plus its share),
    signed int64; a fixed ``noise_seed`` (tests only) makes it reproducible."""
    seed = [noise_seed, client_id, step] if noise_seed >= 0 else secrets.randbits(128)
    vector = encode_signed(summary.reshape(-1), p, np.random.default_rng(seed))
    limit = coordinate_range(p)
    if np.abs(vector).max(initial=0) > limit:  # probability below d·RANGE_TAIL: never for honest noise
        raise RuntimeError(f"a deposited coordinate exceeds the declared range {limit}; the release is withheld")
    return vector
