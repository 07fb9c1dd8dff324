"""The Skellam mechanism of secure sums (common/privacy/skellam.py): its RDP bound against the exact
Rényi divergence, the rounding's norm bound, the noise's variance, the modulus, and its events."""

import math

import numpy as np
import pytest

from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.skellam import (
    conditional_round,
    exact_skellam_rdp_1d,
    modulus_bits,
    rounded_norm_bound,
    sensitivities,
    skellam_rdp,
    skellam_share,
    wrap_probability,
)


@pytest.mark.parametrize("mu", [2.0, 20.0, 1000.0])
@pytest.mark.parametrize("shift", [1, 3, 10])
def test_the_rdp_bound_holds_for_the_exact_divergence(mu, shift):
    """Agarwal et al.'s bound vs the Rényi divergence summed from the pmfs (both directions): never
    below it; tight at low orders (within 7% at μ = 20, 0.1% at μ = 1,000, measured), looser at high
    orders when the shift is large next to √μ (the true Skellam there is lighter than the bound)."""
    for order in (1.5, 2.0, 8.0, 32.0, 64.0):
        exact = exact_skellam_rdp_1d(order, mu=mu, shift=shift)
        bound = float(skellam_rdp([order], mu=mu, l1=shift, l2=shift)[0])
        assert exact <= bound * (1 + 1e-9)
        if mu >= 20 and order <= 2:
            assert bound <= 1.07 * exact


def test_rounding_is_unbiased_and_within_its_bound():
    rng = np.random.default_rng(0)
    dim, clip, gamma = 64, 1.0, 0.01
    x = rng.normal(size=dim)
    x *= clip / np.linalg.norm(x)
    bound = rounded_norm_bound(clip, gamma, dim, beta=1e-6)
    draws = np.stack([conditional_round(x / gamma, bound, rng) for _ in range(3000)])
    assert np.all(np.linalg.norm(draws, axis=1) <= bound)
    assert np.allclose(draws.mean(axis=0), x / gamma, atol=0.05)  # E[round(v)] = v: unbiased
    with pytest.raises(RuntimeError, match="exceeds its clip bound"):
        conditional_round(2 * x / gamma, bound, rng, tries=20)


def test_the_shares_of_survivors_sum_to_the_calibrated_variance():
    rng = np.random.default_rng(1)
    shares = [skellam_share(200_000, 3.5, rng) for _ in range(4)]
    total = np.sum(shares, axis=0)
    assert total.dtype == np.int64
    assert np.var(total) == pytest.approx(2 * 4 * 3.5, rel=0.02)  # Sk(4 × 3.5): variance 2μ


def test_the_modulus_holds_the_sum_and_its_noise():
    bits = modulus_bits(clients=100, bound=150.0, mu_total=1e4)
    assert 2 ** (bits - 1) > 100 * 150 + 6 * math.sqrt(2e4)
    assert wrap_probability(bits=bits, clients=100, bound=150.0, mu_total=1e4, dim=10_000) < 1e-6


def test_a_skellam_event_composes_in_a_ledger_and_round_trips():
    l1, l2 = sensitivities(10.0, 100)
    event = PrivacyEvent.skellam(mu=500.0, l1=l1, l2=l2)
    ledger = PrivacyLedger([event, event])
    assert ledger.history[0].count == 2 and ledger.queries == 2
    again = PrivacyLedger.from_state_dict(ledger.state_dict())
    assert again == ledger and again.history[0].noise == "skellam"
    gaussian = PrivacyLedger([PrivacyEvent(noise_multiplier=event.noise_multiplier, count=2)])
    eps, eps_gauss = ledger.epsilon(delta=1e-5), gaussian.epsilon(delta=1e-5)
    assert eps_gauss <= eps <= 1.05 * eps_gauss  # the Skellam costs a little more than its Gaussian twin
    assert ledger.prv_epsilon(delta=1e-5)[0] is None  # PRV has no Skellam: RDP is the figure
    with pytest.raises(ValueError):
        PrivacyEvent(noise_multiplier=1.0, sample_rate=0.5, noise="skellam", skellam_mu=1.0, l1=1.0, l2=1.0)


@pytest.mark.parametrize("sigma", [0.5, 4.0])
def test_a_secure_plans_epsilon_approaches_dp_accountings_gaussian_from_above(sigma):
    """dp-accounting has no Skellam; at the μ our plans use (Δ₂ ≈ 3·10⁴ after scaling by 1/γ), the
    Skellam's RDP bound must sit above dp-accounting's Gaussian of the same multiplier, and within 1%."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant

    from common.secagg.plan import SecureSumPlan

    unit = SecureSumPlan(4010, 0.32, 1000, 667, 1.0)
    _, l2 = sensitivities(unit.bound, unit.dim)
    plan = SecureSumPlan(4010, 0.32, 1000, 667, (sigma * l2) ** 2 / 2)
    ours = PrivacyLedger([plan.protocol_event()]).epsilon(delta=1e-5)
    accountant = RdpAccountant(orders=[1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
    accountant.compose(dpa.GaussianDpEvent(sigma))
    theirs = accountant.get_epsilon(1e-5)
    assert theirs * (1 - 2e-3) <= ours <= theirs * 1.01, (ours, theirs)


def test_each_skellam_release_spends_its_range_checks_tail_of_delta() -> None:
    """Audit 4, item 9: the docstring said the wrap probability is added to δ; nothing added it. A
    node withholds a release whose noise leaves its declared range (probability ≤ d·RELEASE_TAIL
    whatever the data): the ledger now spends DELTA_PER_RELEASE of δ per Skellam release, for the
    largest d a node masks."""
    from common import secagg
    from common.privacy import PrivacyEvent, PrivacyLedger
    from common.privacy.analysis import epsilon_from_rdp
    from common.privacy.ledger import event_rdp
    from common.privacy.skellam import DELTA_PER_RELEASE, MAX_RELEASE_DIM, RELEASE_TAIL

    assert MAX_RELEASE_DIM == secagg.MAX_LENGTH and DELTA_PER_RELEASE == MAX_RELEASE_DIM * RELEASE_TAIL
    event = PrivacyEvent.skellam(mu=5e3, l1=40.0, l2=20.0, count=7)
    delta = 10 * 7 * DELTA_PER_RELEASE  # large enough for the spent share to move ε measurably
    expected, _ = epsilon_from_rdp(7 * event_rdp(event), delta=delta - 7 * DELTA_PER_RELEASE)
    assert PrivacyLedger([event]).epsilon(delta=delta) == pytest.approx(expected, rel=1e-12)
    assert PrivacyLedger([event]).epsilon(delta=delta) > epsilon_from_rdp(7 * event_rdp(event), delta=delta)[0]
    gaussian = PrivacyEvent(noise_multiplier=1.0, sample_rate=1.0, count=7)  # no range check: nothing spent
    assert PrivacyLedger([gaussian]).epsilon(delta=1e-5) == epsilon_from_rdp(7 * event_rdp(gaussian), delta=1e-5)[0]
