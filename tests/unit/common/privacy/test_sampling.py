"""Sampling that amplification relies on is secret: not derived from the published seed."""

from __future__ import annotations

import torch

from common.privacy import Sampler
from common.privacy.sampling import VOID_SAMPLING_SEED


def test_secret_choices_do_not_follow_any_seed() -> None:
    """Two samplers after the same torch seed (the run's published seed seeds torch) still differ:
    nothing about the draw can be replayed from config.json."""
    draws = []
    for _ in range(2):
        torch.manual_seed(0)
        draws.append(Sampler().choose(list(range(1000)), 10))
    assert draws[0] != draws[1]
    assert Sampler().secret and Sampler().void_reason == ""


def test_choose_is_uniform_without_replacement() -> None:
    sampler, counts = Sampler(), [0] * 5
    for _ in range(2000):
        picked = sampler.choose(list(range(5)), 2)
        assert len(set(picked)) == 2
        for i in picked:
            counts[i] += 1
    assert all(700 < c < 900 for c in counts)  # 800 expected; sd ≈ 18
    assert sorted(sampler.choose(["a", "b"], 5)) == ["a", "b"]


def test_secret_poisson_rate_and_extremes() -> None:
    sampler = Sampler()
    assert sampler.poisson(100, 0.0).numel() == 0
    assert torch.equal(sampler.poisson(100, 1.0), torch.arange(100))
    sizes = [sampler.poisson(1000, 0.05).numel() for _ in range(200)]
    assert 45 < sum(sizes) / len(sizes) < 55
    idx = sampler.poisson(1000, 0.3)
    assert idx.dtype == torch.int64 and torch.equal(idx, idx.sort().values) and len(set(idx.tolist())) == idx.numel()


def test_seeded_sampling_is_reproducible_resumable_and_void() -> None:
    a, b = Sampler(3), Sampler(3)
    assert a.choose(list(range(50)), 4) == b.choose(list(range(50)), 4)
    assert torch.equal(a.poisson(500, 0.1), b.poisson(500, 0.1))
    state = a.state_dict()
    expected = a.choose(list(range(50)), 4)
    c = Sampler(3)
    c.load_state_dict(state)
    assert c.choose(list(range(50)), 4) == expected
    assert not a.secret and a.void_reason == VOID_SAMPLING_SEED
