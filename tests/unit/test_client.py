"""Client-side pieces without Flower: state persistence, warm start, refusals, the query answer."""

import numpy as np
import pytest
import torch

from client import state as client_state
from client.discriminator import answer_query, planned_event, warm_start
from common.codec import GsQuery, PayloadError
from common.config import ExperimentConfig


@pytest.fixture
def cfg():
    return ExperimentConfig(num_clients=2, model="tiny", batch_size=8, n_critic=2,
                            synthetic_samples_per_writer=24, noise_seed=5)


def _query(cfg, step=0):
    rng = np.random.default_rng(step)
    n = (cfg.n_critic + 1) * cfg.batch_size
    return GsQuery(step=step, batch_size=cfg.batch_size,
                   fake=rng.random((n, 1, 28, 28), dtype=np.float32), labels=rng.integers(0, 10, n))


def test_answer_records_exactly_one_event(cfg):
    state = client_state.new_state(cfg, 1)
    answer = answer_query(state, cfg, _query(cfg))
    assert not answer.refused and answer.grad.shape == (8, 1, 28, 28)
    assert state.ledger.queries == 1 and answer.queries == 1
    assert answer.noise_multiplier == pytest.approx(cfg.noise_multiplier / np.sqrt(8))
    assert answer.epsilon == pytest.approx(state.ledger.epsilon(delta=cfg.delta))


def test_malformed_query_is_rejected_before_any_ledger_entry(cfg):
    state = client_state.new_state(cfg, 0)
    q = _query(cfg)
    q.fake = q.fake[:-1]
    with pytest.raises(PayloadError):
        answer_query(state, cfg, q)
    assert state.ledger.queries == 0


def test_budget_refusal_spends_nothing(cfg):
    tight = cfg.replace(client_epsilon_budget=1.0)
    state = client_state.new_state(tight, 0)
    answer = answer_query(state, tight, _query(tight))
    assert answer.refused and "budget" in answer.reason and answer.grad is None
    assert state.ledger.queries == 0
    assert state.ledger.would_exceed(budget=1.0, delta=cfg.delta, next_event=planned_event(cfg, 8))


def test_state_survives_a_new_process_exactly(cfg, tmp_path):
    state = client_state.new_state(cfg, 1)
    answer_query(state, cfg, _query(cfg, 0))
    client_state.save_state(state, tmp_path)
    client_state.clear_cache()  # as if the worker process were new
    loaded = client_state.load_state(cfg, 1, tmp_path, version=state.version)
    assert loaded is not state and loaded.ledger.queries == 1 and loaded.version == state.version
    for a, b in zip(state.discriminator.state_dict().values(), loaded.discriminator.state_dict().values()):
        assert torch.equal(a, b)
    # Both continue identically (same data cursor, same seeded noise).
    a = answer_query(state, cfg, _query(cfg, 1))
    b = answer_query(loaded, cfg, _query(cfg, 1))
    np.testing.assert_array_equal(a.grad, b.grad)


def test_cache_is_used_only_at_the_matching_version(cfg, tmp_path):
    state = client_state.new_state(cfg, 0)
    client_state.save_state(state, tmp_path)
    assert client_state.load_state(cfg, 0, tmp_path, version=state.version) is state
    state.version += 1  # advanced elsewhere, file not rewritten: the cache entry is stale
    assert client_state.load_state(cfg, 0, tmp_path, version=99) is not state


def test_corrupt_state_file_is_a_clear_error(cfg, tmp_path):
    client_state.clear_cache()
    client_state.state_path(tmp_path, 0).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="unreadable"):
        client_state.load_state(cfg, 0, tmp_path, version=1)


def test_warm_start_trains_d_without_privacy_cost(cfg):
    warm = cfg.replace(warmup_steps=4)
    state = client_state.new_state(warm, 0)
    before = [p.detach().clone() for p in state.discriminator.parameters()]
    warm_start(state, warm)
    assert state.warmed_up and state.ledger.queries == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, state.discriminator.parameters()))
