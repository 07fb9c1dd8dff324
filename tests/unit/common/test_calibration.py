"""--target-epsilon: each strategy's noise is set so its headline ε reaches, and never overshoots, the target."""

import math

import pytest

from common.methods import ExperimentConfig, calibrate
from common.privacy import PrivacyEvent, PrivacyLedger


def eps(nm, q, count, delta=1e-5):
    return PrivacyLedger([PrivacyEvent(noise_multiplier=nm, sample_rate=q, count=count)]).epsilon(delta=delta)


@pytest.mark.parametrize("target", [10.0, 50.0])
def test_gswgan_expected_share_reaches_the_target_and_budget_enforces_it(target):
    cfg = calibrate(ExperimentConfig(steps=300, num_clients=20, target_epsilon=target))
    queries = math.ceil(300 / 20)
    nm = cfg.noise_multiplier / math.sqrt(cfg.batch_size)
    assert 0.99 * target <= eps(nm, 1.0, queries) <= target
    assert eps(nm, 1.0, queries + 1) > target and cfg.client_epsilon_budget == target


def test_fedavg_trusted_server_epsilon_reaches_the_target():
    cfg = calibrate(ExperimentConfig(strategy="fedavg-gan", steps=50, num_clients=40, target_epsilon=8.0))
    got = eps(cfg.fedavg_noise_multiplier, 10 / 40, 50)  # Poisson sampling with q = m/K, as the server samples
    assert 7.5 < got <= 8.0


def test_dpgan_target_becomes_the_curators_budget():
    """Adaptive n_D may take more steps than planned: the curator enforces the target as a budget."""
    cfg = calibrate(ExperimentConfig(strategy="dpgan", steps=20, dpgan_n_d=5, target_epsilon=4.0), pooled_size=2400)
    assert cfg.client_epsilon_budget == 4.0
    assert 3.8 < eps(cfg.dpgan_noise_multiplier, 128 / 2400, 100) <= 4.0


def test_no_target_changes_nothing_and_dpgan_needs_n():
    cfg = ExperimentConfig()
    assert calibrate(cfg) is cfg
    with pytest.raises(ValueError, match="pooled data size"):
        calibrate(ExperimentConfig(strategy="dpgan", target_epsilon=3.0))
