"""The audit's lower bounds (common/privacy/audit.py): against closed forms and dp-accounting."""

import math

import dp_accounting
import numpy as np
import pytest

from common.privacy.audit import (
    Guesses,
    best_one_run_epsilon,
    claimed_mu,
    clopper_pearson_epsilon,
    gaussian_epsilon,
    gaussian_mu_lower,
    one_run_epsilon,
    one_run_p_value,
)


@pytest.mark.parametrize("mu", [0.2, 1.0, 3.0])
def test_the_gaussian_curve_agrees_with_dp_accounting(mu):
    """ε(δ) of a 1/σ-GDP mechanism: the Balle–Wang closed form vs dp-accounting's PLD of a Gaussian
    of noise multiplier σ = 1/μ (its grid rounds up: ours sits just below)."""
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(1 / mu))
    assert gaussian_epsilon(mu, 1e-5) == pytest.approx(pld.get_epsilon(1e-5), rel=2e-3)


def test_pure_dp_one_run_bound_is_the_binomial_tail():
    """δ = 0: all r guesses right rejects ε exactly where q^r = β, q = e^ε / (1 + e^ε)."""
    g = Guesses(m=1000, r=200, v=200)
    eps = one_run_epsilon(g, delta=0.0, significance=0.05)
    q = 0.05 ** (1 / 200)
    assert eps == pytest.approx(math.log(q / (1 - q)), rel=1e-4)
    assert one_run_p_value(g, eps, 0.0) == pytest.approx(0.05, rel=1e-4)
    assert one_run_epsilon(Guesses(1000, 200, 100), delta=0.0, significance=0.05) == 0.0  # coin flips
    assert one_run_p_value(g, eps, 1e-3) > one_run_p_value(g, eps, 0.0)  # δ only weakens a rejection


def test_bounds_on_a_known_gaussian_shift_lie_below_the_truth_and_near_it():
    rng = np.random.default_rng(3)
    mu, n = 1.0, 20_000
    ins, outs = rng.normal(mu / 2, 1, n), rng.normal(-mu / 2, 1, n)
    low = gaussian_mu_lower(ins, outs, 0.0, significance=0.05)
    assert 0.9 < low < mu
    eps_cp, tpr, fpr = clopper_pearson_epsilon(ins, outs, 1.5, delta=1e-5, significance=0.05)
    assert 0 < eps_cp < gaussian_epsilon(mu, 1e-5) and tpr > fpr
    scores, bits = np.concatenate([ins, outs]), np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    one_run, guesses = best_one_run_epsilon(scores, bits, delta=1e-5, significance=0.05)
    assert 0 < one_run < gaussian_epsilon(mu, 1e-5) and guesses.v <= guesses.r


def test_claimed_mu_composes_the_releases():
    assert claimed_mu([2.0, 2.0], [1, 3]) == pytest.approx(1.0)
    assert math.isinf(claimed_mu([0.0], [1]))
