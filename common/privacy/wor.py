"""RDP of the Gaussian mechanism under sampling WITHOUT replacement (fixed-size subsets).

Opacus' accountants bound Poisson subsampling under add/remove adjacency. When a server picks
exactly m of n clients uniformly at random (GS-WGAN's client sampling), the matching analysis is
sampling without replacement under replace-one adjacency: n is public and a neighbouring
federation has one client's data replaced. Wang, Balle & Kasiviswanathan, "Subsampled Rényi
Differential Privacy and Analytical Moments Accountant" (AISTATS 2019) give the bound used here.

For integer α ≥ 2, γ = m/n and a base mechanism with RDP ε(j) (Gaussian: ε(j) = j / (2 nm²)):

    A_α = 1 + γ² C(α,2) min{4 (e^{ε(2)} − 1), 2 e^{ε(2)}}
            + Σ_{j=3..α} γ^j C(α,j) min{4 B_j, 2 e^{(j−1) ε(j)}},        ε'(α) = log(A_α) / (α − 1)

The 2 e^{(j−1)ε(j)} terms are their Theorem 9 (any mechanism, ε(∞) = ∞); B_j is the Gaussian
refinement of their Theorem 27: with h(x) = e^{(x−1) ε(x)}, B_j is the j-th forward difference
Δ^j h(0) for even j and the geometric mean of Δ^{j−1} h(0) and Δ^{j+1} h(0) for odd j. Forward
differences of a fast-growing exponential cancel heavily, so they are computed in arbitrary
precision (mpmath) once per noise multiplier; above ``EXACT_MAX_ORDER`` only the Theorem 9 terms
are used (still an upper bound, and the usual practice).

Fractional orders interpolate the cumulant log A linearly between ⌊α⌋ and ⌈α⌉, which is an upper
bound because it is convex in α (their Corollary 10); with log A_1 = 0 every α in (1, 2) gets
ε'(2). Amplification therefore needs noise: at GS-WGAN's defaults (nm = σ/√B ≈ 0.19) one query
already has ε(2) ≈ 28 and this bound is far above composing the queries without amplification.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import mpmath
import numpy as np
from scipy.special import gammaln

# Exact Theorem-27 terms up to this order; beyond it Theorem 9's terms only (O(α) per order).
EXACT_MAX_ORDER = 256


def _log_binom(n: int, k: int) -> float:
    return float(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values))


@functools.lru_cache(maxsize=64)
def _log_forward_differences(noise_multiplier: float, max_order: int) -> tuple[float, ...]:
    """``log Δ^ℓ h(0)`` for ℓ = 0..max_order with h(x) = exp((x−1) x / (2 nm²)).

    h is the exponential of a convex quadratic, so every forward difference at 0 is positive; the
    alternating sum is evaluated with enough digits to survive its cancellation (about ℓ·log10 2
    digits plus what the near-polynomial regime of a large noise multiplier costs).
    """
    inv = 1.0 / (2.0 * noise_multiplier**2)
    digits = 40 + int(max_order * (0.31 + max(0.0, math.log10(max(noise_multiplier**2, 1.0))) / 2 + 0.1))
    with mpmath.workdps(digits):
        h = [mpmath.exp(mpmath.mpf(x - 1) * x * inv) for x in range(max_order + 1)]
        out = []
        row = h
        for _ in range(max_order + 1):
            value = row[0]
            out.append(float(mpmath.log(value)) if value > 0 else -math.inf)
            row = [row[i + 1] - row[i] for i in range(len(row) - 1)]
    return tuple(out)


def _log_a_int(noise_multiplier: float, gamma: float, alpha: int) -> float:
    """log A_α of the bound above, integer α ≥ 1 (log A_1 = 0)."""
    if alpha <= 1:
        return 0.0

    def eps(j: int) -> float:  # RDP of the Gaussian at order j
        return j / (2.0 * noise_multiplier**2)

    log_gamma = math.log(gamma)
    e2 = eps(2)
    log_e2_minus_1 = e2 + math.log(-math.expm1(-e2))
    terms = [0.0, 2 * log_gamma + _log_binom(alpha, 2) + min(math.log(4) + log_e2_minus_1, math.log(2) + e2)]
    exact = alpha <= EXACT_MAX_ORDER
    diffs = _log_forward_differences(noise_multiplier, EXACT_MAX_ORDER + 1) if exact else ()
    for j in range(3, alpha + 1):
        general = math.log(2) + (j - 1) * eps(j)
        if exact:
            lo, hi = diffs[2 * (j // 2)], diffs[2 * ((j + 1) // 2)]
            general = min(general, math.log(4) + 0.5 * (lo + hi))
        terms.append(j * log_gamma + _log_binom(alpha, j) + general)
    return _logsumexp(terms)


@functools.lru_cache(maxsize=1024)
def wor_rdp_curve(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP at each order of ONE run of the Gaussian (``noise_multiplier``) on a uniformly drawn
    subset of size m = γ·n, γ = ``sample_rate`` (replace-one adjacency). Read-only, cached."""
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
    if sample_rate == 0.0:
        curve = np.zeros(len(orders))
    elif noise_multiplier == 0.0:
        curve = np.full(len(orders), math.inf)
    elif sample_rate == 1.0:
        curve = np.array([a / (2.0 * noise_multiplier**2) for a in orders])
    else:
        log_a = functools.lru_cache(maxsize=None)(lambda a: _log_a_int(noise_multiplier, sample_rate, a))
        curve = np.array([_order_rdp(log_a, float(a)) for a in orders])
    curve.setflags(write=False)
    return curve


def _order_rdp(log_a, alpha: float) -> float:
    if alpha <= 1.0:
        raise ValueError(f"RDP orders must exceed 1, got {alpha}")
    low, high = math.floor(alpha), math.ceil(alpha)
    if low == high:
        return log_a(low) / (alpha - 1)
    t = alpha - low
    return ((1 - t) * log_a(low) + t * log_a(high)) / (alpha - 1)


def wor_rdp(noise_multiplier: float, sample_rate: float, orders: Sequence[float]) -> np.ndarray:
    """:func:`wor_rdp_curve` for any sequence of orders."""
    return wor_rdp_curve(float(noise_multiplier), float(sample_rate), tuple(float(a) for a in orders))
