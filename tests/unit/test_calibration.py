"""--target-epsilon: each strategy's noise is set so its headline ε reaches, and never overshoots, the target."""

import math

import pytest

from common.calibration import calibrate
from common.config import ExperimentConfig
from common.privacy import PrivacyEvent, PrivacyLedger, amplified_epsilon


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
    got = eps(cfg.fedavg_noise_multiplier, 10 / 40, 50)
    assert 7.5 < got <= 8.0
    assert got == pytest.approx(amplified_epsilon(noise_multiplier=cfg.fedavg_noise_multiplier,
                                                  sample_rate=0.25, steps=50, delta=1e-5))


def test_no_target_changes_nothing_and_dpgan_needs_n():
    cfg = ExperimentConfig()
    assert calibrate(cfg) is cfg
    with pytest.raises(ValueError, match="pooled data size"):
        calibrate(ExperimentConfig(strategy="dpgan", target_epsilon=3.0))
