"""Distributed discrete noise for secure sums: the Skellam mechanism, quantization, its privacy.

Why Skellam (Agarwal, Kairouz & Liu 2021) rather than the distributed discrete Gaussian (Kairouz,
Liu & Steinke 2021): a sum of independent Skellam shares is again Skellam, Sk(μ₁ + μ₂), so the noise
of a secure sum of any survivors is known exactly (no "approximately discrete Gaussian" slack that
grows as the shares get small), it is sampled as a difference of two Poissons from a stock sampler,
and its RDP has a closed form close to the Gaussian's. Sk(μ) below is Poisson(μ) − Poisson(μ):
mean 0, variance 2μ per coordinate.

A client's release x ∈ ℝ^d, clipped to ‖x‖₂ ≤ C, becomes integers in three steps:
1. scale by 1/γ (γ the granularity);
2. conditional randomized rounding (Kairouz et al. 2021, §4.1): round each coordinate up or down
   at random, unbiased, and redraw until the rounded vector's norm is at most ``rounded_norm_bound``
   (holds with probability ≥ 1 − β at the first draw), so the integer vector's sensitivity is a
   fixed Δ₂, and Δ₁ ≤ min(√d·Δ₂, Δ₂²) (an integer vector's ℓ₁ is at most its ℓ₂²);
3. add a noise share Sk(μ_share) per coordinate.
The secure sum of n ≥ t such vectors carries Sk(n·μ_share) ⪰ Sk(t·μ_share): calibrating the share
for t survivors is conservative for more. Replace-one adjacency of one client moves the sum by
at most 2Δ₂ (ℓ₂) and 2Δ₁ (ℓ₁).

``skellam_rdp`` is Agarwal et al.'s Theorem (the multi-dimensional Skellam mechanism): for α ≥ 1,
ε(α) ≤ α Δ₂² / (4μ) + min(((2α − 1) Δ₂² + 6 Δ₁) / (16 μ²), 3 Δ₁ / (4μ)); the tests check it
against the exact Rényi divergence of the one-dimensional mechanism.

What is and is not in δ. No revealed sum can wrap: every deposited coordinate is checked on its node
to lie in ±R (its rounded part plus a noise tail, ``RELEASE_TAIL``), and the modulus holds ±c·R.
The check withholds a release whose noise leaves ±R, an event of probability at most d·RELEASE_TAIL
whatever the data: so each release is (ε, δ + d·RELEASE_TAIL)-DP where the untruncated mechanism is
(ε, δ), and the ledger spends ``DELTA_PER_RELEASE`` (the largest d a node accepts times the tail) of
δ per Skellam release before converting RDP to ε. ``wrap_probability`` is the plain-arithmetic
bound, for a sum that is not range-checked (the benchmarks). Not in δ: the shares are drawn with
NumPy's floating-point Poisson sampler (PTRS), whose distance from the exact Poisson at λ ≈ 10⁹ is
not bounded here (an exact integer sampler at that λ is an open item, docs/secure-aggregation.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

RELEASE_TAIL = 1e-24  # a deposited coordinate's noise leaves its declared range with at most this probability
MAX_RELEASE_DIM = 1 << 26  # the most coordinates a node masks (``common.secagg.MAX_LENGTH``)
DELTA_PER_RELEASE = MAX_RELEASE_DIM * RELEASE_TAIL  # ≈ 6.7e-17: the δ a Skellam release spends on its range check


def skellam_rdp(orders: Sequence[float], *, mu: float, l1: float, l2: float) -> np.ndarray:
    """RDP of the d-dimensional Skellam mechanism Sk(μ) per coordinate, sensitivities Δ₁, Δ₂."""
    a = np.asarray(orders, dtype=float)
    if mu <= 0:
        return np.full(a.shape, math.inf)
    main = a * l2**2 / (4 * mu)
    correction = np.minimum(((2 * a - 1) * l2**2 + 6 * l1) / (16 * mu**2), 3 * l1 / (4 * mu))
    return main + correction


def exact_skellam_rdp_1d(order: float, *, mu: float, shift: int) -> float:
    """D_α(Sk(μ) + shift ‖ Sk(μ)) computed by summing the pmfs (and the reverse direction; the
    larger): the numerical check of ``skellam_rdp`` at small parameters."""
    span = int(shift + 40 * math.sqrt(2 * mu) + 60)
    k = np.arange(-span, span + 1)
    log_p = stats.skellam.logpmf(k, mu, mu)
    log_q = stats.skellam.logpmf(k - shift, mu, mu)
    out = []
    keep = np.isfinite(log_p) & np.isfinite(log_q)  # far tails underflow; their terms are negligible
    for a, b in ((log_q[keep], log_p[keep]), (log_p[keep], log_q[keep])):
        terms = order * a + (1 - order) * b
        out.append(float(np.logaddexp.reduce(terms)) / (order - 1))
    return max(out)


def rounded_norm_bound(clip: float, gamma: float, dim: int, beta: float) -> float:
    """The norm bound of the conditionally rounded vector (Kairouz et al. 2021, Thm. 2 / eq. 13):
    a scaled vector of norm ≤ c = C/γ rounds to one of norm ≤ min(c + √d, sqrt(c² + d/4 +
    √(2 log(1/β))·(c + √d/2))) with probability ≥ 1 − β."""
    c = clip / gamma
    loose = c + math.sqrt(dim)
    tight = math.sqrt(c**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(dim) / 2))
    return min(loose, tight)


def conditional_round(scaled: np.ndarray, bound: float, rng: np.random.Generator, *, tries: int = 1000) -> np.ndarray:
    """Unbiased randomized rounding of ``scaled`` to integers, redrawn until ‖·‖₂ ≤ ``bound``."""
    floor = np.floor(scaled)
    frac = scaled - floor
    for _ in range(tries):
        rounded = floor + (rng.random(scaled.shape) < frac)
        if float(np.linalg.norm(rounded)) <= bound:
            return rounded.astype(np.int64)
    raise RuntimeError(f"no rounding within norm {bound:.4g} in {tries} draws: the vector exceeds its clip bound")


def skellam_share(dim: int, mu_share: float, rng: np.random.Generator) -> np.ndarray:
    """One client's noise share: Sk(μ_share) on each of ``dim`` coordinates."""
    return rng.poisson(mu_share, dim).astype(np.int64) - rng.poisson(mu_share, dim).astype(np.int64)


def sensitivities(bound: float, dim: int) -> tuple[float, float]:
    """(Δ₁, Δ₂) of the secure sum under replace-one adjacency of one client whose rounded vector has
    ‖·‖₂ ≤ ``bound``: Δ₂ = 2·bound, Δ₁ = 2·min(√d·bound, bound²)."""
    return 2 * min(math.sqrt(dim) * bound, bound**2), 2 * bound


def modulus_bits(*, clients: int, bound: float, mu_total: float, tail: float = 1e-12) -> int:
    """Bits b of the modulus 2^b so that a sum of ``clients`` in-range vectors plus its noise stays in
    (−2^(b−1), 2^(b−1)) except with probability ``tail`` per coordinate (``wrap_probability``)."""
    reach = clients * bound + skellam_tail(mu_total, tail)
    return int(math.ceil(math.log2(2 * reach + 1))) + 1


def skellam_tail(mu: float, tail: float) -> float:
    """A value the magnitude of Sk(μ) exceeds with probability below ``tail`` (Chernoff bound on the
    Skellam's moment generating function, at the optimal tilt)."""
    lo, hi = 0.0, 1.0
    while _skellam_chernoff(mu, hi) > tail:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _skellam_chernoff(mu, mid) > tail else (lo, mid)
    return hi


def _skellam_chernoff(mu: float, x: float) -> float:
    """P[|Sk(μ)| ≥ x] ≤ 2 exp(2μ(cosh t − 1) − t x) at t = asinh(x / 2μ)."""
    if mu <= 0:
        return 0.0 if x > 0 else 1.0
    t = math.asinh(x / (2 * mu))
    return min(1.0, 2 * math.exp(2 * mu * (math.cosh(t) - 1) - t * x))


def wrap_probability(*, bits: int, clients: int, bound: float, mu_total: float, dim: int) -> float:
    """An upper bound on the chance that any coordinate of the noisy sum leaves the modular range."""
    room = 2 ** (bits - 1) - 1 - clients * bound
    return min(1.0, dim * _skellam_chernoff(mu_total, room)) if room > 0 else 1.0
