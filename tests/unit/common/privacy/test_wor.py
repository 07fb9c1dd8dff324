"""The without-replacement bound (Wang, Balle, Kasiviswanathan 2019) that GS-WGAN's amplified ε uses:
against Google's dp-accounting, against the exact divergence of small instances, and its shape."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import (
    _compute_rdp_sample_wor_gaussian as dpa_wor_rdp,
)
from scipy import integrate, special

from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.analysis import ORDERS
from common.privacy.wor import _log_forward_differences, wor_rdp

DELTA = 1e-5
NM = 1.07 / math.sqrt(32)


@pytest.mark.parametrize("nm", [NM, 0.7, 1.0, 3.0])
@pytest.mark.parametrize("q", [1 / 20, 1 / 1000, 0.3])
def test_matches_dp_accounting_where_its_float_arithmetic_holds(nm: float, q: float) -> None:
    mine = wor_rdp(nm, q, ORDERS)
    theirs = dpa_wor_rdp(q, nm, ORDERS)
    np.testing.assert_allclose(mine, theirs, rtol=1e-8)


def test_forward_differences_are_exact_where_float64_cancels() -> None:
    """dp-accounting takes the forward differences of exp((x-1)x/(2σ²)) in float64, whose alternating
    sums cancel catastrophically for large σ (its high-order terms turn into noise, even change sign).
    Ours are evaluated with mpmath at the precision the cancellation needs: the same values as at
    twice that precision, and never above dp-accounting's RDP."""
    nm = 10.0
    mine = _log_forward_differences(nm, 80)
    with mpmath.workdps(800):
        h = [mpmath.exp(mpmath.mpf(x - 1) * x / (2 * nm**2)) for x in range(81)]
        for order in (2, 17, 40, 80):
            exact = mpmath.fsum((-1) ** (order - i) * mpmath.binomial(order, i) * h[i] for i in range(order + 1))
            assert mine[order] == pytest.approx(float(mpmath.log(exact)), rel=1e-12)
    assert np.all(wor_rdp(nm, 0.3, ORDERS) <= dpa_wor_rdp(0.3, nm, ORDERS) * (1 + 1e-9))


def _renyi(p_means: list[float], q_means: list[float], sigma: float, alpha: int) -> float:
    """D_α(P‖Q) of two equal-weight mixtures of 1-D Gaussians N(μ, σ²), by quadrature in log space."""

    def log_mix(x: float, means: list[float]) -> float:
        return special.logsumexp([-((x - m) ** 2) / (2 * sigma**2) for m in means]) - math.log(len(means))

    lo, hi = min(p_means + q_means) - 40 * sigma, max(p_means + q_means) + 40 * sigma

    def integrand(x):
        return math.exp(
            alpha * log_mix(x, p_means)
            - (alpha - 1) * log_mix(x, q_means)  # noqa: E731
            - math.log(sigma * math.sqrt(2 * math.pi))
        )

    value, _ = integrate.quad(integrand, lo, hi, limit=400, points=sorted(set(p_means + q_means)))
    return math.log(value) / (alpha - 1)


@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.0])
@pytest.mark.parametrize("n", [2, 4])
def test_bound_dominates_the_exact_divergence_of_small_federations(sigma: float, n: int) -> None:
    """n clients, one drawn uniformly per step, its answer N(f(data), σ²) with sensitivity 1 (any two
    clients' answers differ by at most 1, as GS-WGAN's clipped gradients by at most 2C): replace
    client 0's data (f: 0 -> 1) while the others' answers sit anywhere in that range. The exact Rényi
    divergence of the two output mixtures must stay below the bound at every order."""
    for others in (0.0, 0.25, 0.5, 1.0):
        p = [0.0] + [others] * (n - 1)
        q = [1.0] + [others] * (n - 1)
        for alpha in (2, 3, 5, 8):
            exact = max(_renyi(p, q, sigma, alpha), _renyi(q, p, sigma, alpha))
            assert exact <= wor_rdp(sigma, 1 / n, [alpha])[0] * (1 + 1e-9) + 1e-12, (sigma, n, others, alpha)


def test_shape_of_the_bound() -> None:
    curve = wor_rdp(1.0, 0.05, ORDERS)
    assert np.all(wor_rdp(1.0, 0.1, ORDERS) >= curve) and np.all(wor_rdp(1.5, 0.05, ORDERS) <= curve)
    np.testing.assert_allclose(wor_rdp(1.0, 1.0, [2.0, 7.5]), [1.0, 3.75])  # q = 1: the Gaussian, α/(2σ²)
    below_two = [a for a in ORDERS if a < 2]
    np.testing.assert_allclose(wor_rdp(1.0, 0.05, below_two), wor_rdp(1.0, 0.05, [2.0])[0], rtol=1e-12)
    assert np.all(wor_rdp(0.0, 0.5, [2.0, 3.0]) == math.inf)


def test_golden_gswgan_defaults_without_replacement() -> None:
    """`make run`'s federation: 300 steps, 1 of 20 clients, σ = 1.07, B = 32. Without replacement the
    bound is far above the per-client figure (~306 for the expected 15 queries): at this noise one
    query already has ε(2) ≈ 28, and amplification needs noise to work with."""
    ledger = PrivacyLedger(
        [PrivacyEvent(noise_multiplier=NM, sample_rate=1 / 20, count=300, sampling="wor", population=20)]
    )
    assert ledger.epsilon(delta=DELTA) == pytest.approx(6805.64, rel=1e-4)
    per_client = PrivacyLedger([PrivacyEvent(noise_multiplier=NM, count=15)]).epsilon(delta=DELTA)
    assert per_client < 320 < ledger.epsilon(delta=DELTA)
