"""Privacy math: golden ε pinned to Opacus 1.6, an independent implementation, PRV beside RDP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from common.privacy import analysis
from common.privacy.analysis import (
    ORDERS,
    prv_epsilon,
    prv_epsilon_with_reason,
    query_noise_multiplier,
    rdp_curve,
    rdp_epsilon,
)

DELTA = 1e-5
# GS-WGAN's defaults: σ=1.07, B=32 -> one query is a Gaussian mechanism with multiplier σ/√B.
NM = 1.07 / math.sqrt(32)


def _interior(order: float) -> bool:
    return ORDERS[0] < order < ORDERS[-1]


# --- independent implementation (no Opacus) ------------------------------------------------------
def own_gaussian_epsilon(noise_multiplier: float, queries: int, delta: float, *, balle: bool) -> float:
    """RDP of the plain Gaussian mechanism, α/(2·nm²) per query, composed and converted to (ε, δ).

    ``balle=False``: the classic conversion ε = RDP + log(1/δ)/(α-1) (Mironov 2017, Prop. 3).
    ``balle=True``: Balle et al. 2020 Thm. 21, the conversion Opacus uses.
    """
    alphas = np.asarray(ORDERS)
    rdp = queries * alphas / (2 * noise_multiplier**2)
    if balle:
        eps = rdp + (math.log(1 / delta) - np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)
    else:
        eps = rdp + math.log(1 / delta) / (alphas - 1)
    return float(eps.min())


def exact_gaussian_epsilon(noise_multiplier: float, queries: int, delta: float) -> float:
    """Tight ε of n composed Gaussian mechanisms: μ-GDP with μ=√n/nm (Balle & Wang 2018, Thm. 8)."""
    mu = math.sqrt(queries) / noise_multiplier

    def excess(eps: float) -> float:
        tail = math.exp(special.log_ndtr(-eps / mu + mu / 2))
        return tail - math.exp(eps + special.log_ndtr(-eps / mu - mu / 2)) - delta

    return optimize.brentq(excess, 0.0, 1e5, xtol=1e-10)


# --- the grid and the per-query rule -------------------------------------------------------------
def test_orders_reach_near_one_and_far_out() -> None:
    assert list(ORDERS) == sorted(set(ORDERS))
    assert ORDERS[0] <= 1.001 and ORDERS[-1] >= 256


def test_query_noise_multiplier_is_sigma_over_sqrt_b() -> None:
    assert query_noise_multiplier(noise_multiplier=1.07, batch_size=32) == pytest.approx(0.189151064)
    assert query_noise_multiplier(noise_multiplier=2.0, batch_size=1) == 2.0
    with pytest.raises(ValueError):
        query_noise_multiplier(noise_multiplier=1.0, batch_size=0)
    with pytest.raises(TypeError):
        query_noise_multiplier(1.0, 32)  # keyword-only: σ and B cannot be swapped


# --- golden values (Opacus 1.6 RDP on ORDERS) ----------------------------------------------------
def test_golden_poisson_amplified_defaults() -> None:
    """GS-WGAN's paper settings: q=1/1000, T=20000, σ/√B -> about 360 under Poisson sampling (the per-sample
    script's 9.99 is wrong). fedgan's server samples without replacement: see test_privacy_wor."""
    eps, order = rdp_epsilon([(NM, 1e-3, 20_000)], delta=DELTA)
    assert eps == pytest.approx(359.4802262420863, rel=1e-6)
    assert abs(eps - 360) < 5 and _interior(order)


def test_golden_per_client_twenty_queries() -> None:
    eps, order = rdp_epsilon([(NM, 1.0, 20)], delta=DELTA)
    assert eps == pytest.approx(390.26383633130706, rel=1e-9)
    assert order == pytest.approx(1.1995, abs=1e-3) and _interior(order)


def test_golden_per_client_many_queries_picks_orders_near_one() -> None:
    """A client answering all 20,000 steps (K=1): optimum at α≈1.006, still inside the grid."""
    eps, order = rdp_epsilon([(NM, 1.0, 20_000)], delta=DELTA)
    assert eps == pytest.approx(283082.5281893088, rel=1e-9)
    assert 1.005 < order < 1.008 and _interior(order)


def test_golden_opacus_mnist_example() -> None:
    """Opacus/TF Privacy's MNIST case: q=256/60000, σ=1.1, 60 epochs. Quoted as ≈2.9 with the old
    log(1/δ)/(α-1) conversion; Opacus' Balle et al. conversion gives ≈2.60."""
    eps, order = rdp_epsilon([(1.1, 256 / 60_000, 60 * 60_000 // 256)], delta=DELTA)
    assert eps == pytest.approx(2.5969811785953, rel=1e-6)
    assert order == 8.0 and _interior(order)


def test_golden_prv_values() -> None:
    assert prv_epsilon([(NM, 1e-3, 20_000)], delta=DELTA) == pytest.approx(329.9362797143649, rel=1e-4)
    assert prv_epsilon([(NM, 1.0, 20)], delta=DELTA) == pytest.approx(379.92238650519215, rel=1e-4)


# --- independent implementation ------------------------------------------------------------------
@pytest.mark.parametrize("nm,queries", [(NM, 1), (NM, 20), (0.5, 100), (1.0, 1), (2.0, 20), (5.0, 3)])
def test_rdp_matches_independent_gaussian_implementation(nm: float, queries: int) -> None:
    eps, _ = rdp_epsilon([(nm, 1.0, queries)], delta=DELTA)
    assert eps == pytest.approx(own_gaussian_epsilon(nm, queries, DELTA, balle=True), rel=1e-10)
    # The classic conversion is looser, and the closed-form optimum over continuous α,
    # ρ + 2√(ρ·log(1/δ)) with ρ = n/(2nm²), is within a few percent of the grid's.
    classic = own_gaussian_epsilon(nm, queries, DELTA, balle=False)
    rho = queries / (2 * nm**2)
    assert eps <= classic <= (rho + 2 * math.sqrt(rho * math.log(1 / DELTA))) * 1.01
    assert eps >= 0.8 * classic


@pytest.mark.parametrize("nm,queries", [(NM, 1), (NM, 20), (0.5, 100), (2.0, 20), (5.0, 3)])
def test_exact_gaussian_below_prv_below_rdp(nm: float, queries: int) -> None:
    """For q=1 the exact ε is known: PRV (estimate + eps_error) must sit between it and RDP."""
    exact = exact_gaussian_epsilon(nm, queries, DELTA)
    prv = prv_epsilon([(nm, 1.0, queries)], delta=DELTA)
    rdp, _ = rdp_epsilon([(nm, 1.0, queries)], delta=DELTA)
    assert prv is not None
    assert exact <= prv <= exact + 2 * max(analysis.PRV_EPS_ERRORS)  # estimate ± eps_error, + eps_error
    assert prv <= rdp


def test_prv_close_to_rdp_mid_range_subsampled() -> None:
    events = [(1.1, 256 / 60_000, 60 * 60_000 // 256)]
    prv = prv_epsilon(events, delta=DELTA)
    rdp, _ = rdp_epsilon(events, delta=DELTA)
    assert prv is not None and 0.85 * rdp <= prv <= rdp


# --- composition and edge cases ------------------------------------------------------------------
def test_heterogeneous_events_compose_by_summing_rdp() -> None:
    split = rdp_curve([(NM, 1.0, 3), (0.7, 0.1, 5), (NM, 1.0, 2)])
    joined = rdp_curve([(NM, 1.0, 5), (0.7, 0.1, 5)])
    np.testing.assert_allclose(split, joined, rtol=1e-12)
    split_eps = rdp_epsilon([(NM, 1.0, 3), (NM, 1.0, 2)], delta=DELTA)
    assert split_eps == pytest.approx(rdp_epsilon([(NM, 1.0, 5)], delta=DELTA), rel=1e-12)


def test_no_events_is_zero_and_no_noise_is_infinite() -> None:
    assert rdp_epsilon([], delta=DELTA)[0] == 0.0
    assert rdp_epsilon([(NM, 0.0, 10), (NM, 1.0, 0)], delta=DELTA)[0] == 0.0
    assert prv_epsilon([], delta=DELTA) == 0.0
    assert rdp_epsilon([(0.0, 1.0, 1)], delta=DELTA)[0] == math.inf
    assert rdp_epsilon([(NM, 1.0, 5), (0.0, 0.01, 1)], delta=DELTA)[0] == math.inf
    assert prv_epsilon([(0.0, 1.0, 1)], delta=DELTA) == math.inf
    assert rdp_epsilon([(0.0, 0.5, 3)], delta=DELTA)[0] == math.inf


@pytest.mark.parametrize("bad", [(-1.0, 1.0, 1), (1.0, 1.5, 1), (1.0, 1.0, -1), (math.nan, 1.0, 1), (1.0, 1.0, 1.5)])
def test_invalid_events_are_rejected(bad: tuple) -> None:
    with pytest.raises(ValueError):
        rdp_epsilon([bad], delta=DELTA)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, math.nan])
def test_invalid_delta_is_rejected(delta: float) -> None:
    with pytest.raises(ValueError):
        rdp_epsilon([(NM, 1.0, 1)], delta=delta)
    with pytest.raises(ValueError):
        prv_epsilon([(NM, 1.0, 1)], delta=delta)


def test_prv_gives_none_with_reason_beyond_its_float_range() -> None:
    """60 queries at σ/√B: ε≈1000 needs a privacy-loss domain where float64 exp overflows; Opacus
    would return inf. We return None and say why, and RDP still gives a number."""
    eps, reason = prv_epsilon_with_reason([(NM, 1.0, 60)], delta=DELTA)
    assert eps is None and "domain" in reason
    assert prv_epsilon([(NM, 1.0, 60)], delta=DELTA) is None
    assert math.isfinite(rdp_epsilon([(NM, 1.0, 60)], delta=DELTA)[0])


def test_prv_failure_inside_opacus_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self, delta, **kwargs):
        raise RuntimeError("Discrete mean differs significantly from continuous mean.")

    analysis._prv_cached.cache_clear()
    from opacus.accountants import PRVAccountant  # the class analysis imports where PRV runs

    monkeypatch.setattr(PRVAccountant, "get_epsilon", boom)
    eps, reason = prv_epsilon_with_reason([(1.234567, 1.0, 7)], delta=DELTA)
    analysis._prv_cached.cache_clear()
    assert eps is None and "RuntimeError" in reason


def test_amplification_helps() -> None:
    amplified = rdp_epsilon([(1.0, 0.01, 100)], delta=DELTA)[0]
    assert amplified < rdp_epsilon([(1.0, 1.0, 100)], delta=DELTA)[0]


# --- properties ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(nm=st.floats(0.05, 20.0), queries=st.integers(1, 5_000))
def test_epsilon_strictly_grows_with_queries(nm: float, queries: int) -> None:
    fewer, _ = rdp_epsilon([(nm, 1.0, queries)], delta=DELTA)
    more, _ = rdp_epsilon([(nm, 1.0, queries + 1)], delta=DELTA)
    assert more > fewer > 0


@settings(max_examples=60, deadline=None)
@given(nm=st.floats(0.05, 20.0), factor=st.floats(1.01, 4.0), queries=st.integers(1, 1_000))
def test_epsilon_falls_with_noise(nm: float, factor: float, queries: int) -> None:
    noisier, _ = rdp_epsilon([(nm * factor, 1.0, queries)], delta=DELTA)
    assert noisier < rdp_epsilon([(nm, 1.0, queries)], delta=DELTA)[0]


@settings(max_examples=8, deadline=None)
@given(nm=st.sampled_from([0.5, 1.0, 2.0]), q=st.sampled_from([0.001, 0.01]), steps=st.integers(1, 10_000))
def test_subsampled_epsilon_grows_with_steps_and_falls_with_noise(nm: float, q: float, steps: int) -> None:
    eps = rdp_epsilon([(nm, q, steps)], delta=DELTA)[0]
    assert rdp_epsilon([(nm, q, steps + 1)], delta=DELTA)[0] > eps
    assert rdp_epsilon([(nm * 1.5, q, steps)], delta=DELTA)[0] < eps


def test_the_standalone_rdp_module_is_opacus_own_and_gives_its_values() -> None:
    """Clients load Opacus' rdp.py without the package (start-up time): the same file, the same ε."""
    import opacus.accountants.analysis.rdp as packaged

    standalone = analysis._opacus_rdp()
    assert standalone.__file__ == packaged.__file__
    loaded_alone = analysis.importlib.util.module_from_spec(
        analysis.importlib.util.spec_from_file_location("_rdp_check", packaged.__file__)
    )
    loaded_alone.__spec__.loader.exec_module(loaded_alone)
    orders = [1.5, 2.0, 8.0, 64.0]
    for q, sigma in ((1.0, 1.1), (0.01, 0.8)):
        ours = loaded_alone.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
        theirs = packaged.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
        assert list(ours) == list(theirs)


def test_a_client_process_checks_budgets_without_importing_the_opacus_package() -> None:
    """A ClientApp (one process per message in a deployment) must not pay opacus/__init__'s import."""
    import subprocess
    import sys

    code = (
        "import sys, client.app; from common.privacy.analysis import rdp_epsilon; "
        "eps = rdp_epsilon([(1.0, 1.0, 3)], delta=1e-5)[0]; "
        "print(eps > 0, 'opacus' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
