"""--target-epsilon: each strategy's noise is set so its headline ε reaches, and never overshoots, the target."""

import math

import pytest

from common.methods import ExperimentConfig, calibrate, schedule_notes
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


@pytest.mark.parametrize(("steps", "m", "k", "full"), [(200, 8, 3000, 375), (7, 3, 20, 13)])
def test_gswgan_notes_the_answers_its_schedule_leaves_unspent_and_the_steps_that_spend_them(steps, m, k, full):
    """K = 3,000, m 8, T 200 (the seeded frontier rows): each client may answer once, 1,600 of 3,000 are
    asked for; the note's --steps asks for all of them at the same σ, and then the note is gone (one
    step more is the next budget level, a larger σ, which the note names again)."""
    short = ExperimentConfig(steps=steps, clients_per_step=m, num_clients=k, target_epsilon=10.0)
    (note,) = schedule_notes(short)
    assert f"--steps {full} " in note and f"{steps * m:,} answers" in note
    spent = short.replace(steps=full)
    assert schedule_notes(spent) == []
    assert calibrate(spent).noise_multiplier == calibrate(short).noise_multiplier
    assert calibrate(short.replace(steps=full + 1)).noise_multiplier > calibrate(short).noise_multiplier
    assert schedule_notes(short.replace(target_epsilon=0.0)) == []  # nothing calibrated, nothing to say


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
