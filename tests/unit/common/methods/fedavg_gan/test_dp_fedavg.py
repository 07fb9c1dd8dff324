"""User-level DP-FedAvg: delta arithmetic, clip/noise/average with a fixed denominator (any number of
replies, none included), non-finite deltas as zero, and the privacy event of a round. Tiny models,
seeded; exact counters, no loss values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from common.methods.fedavg_gan.dp_fedavg import aggregate_deltas, apply_delta, clip_delta, delta_norm, flatten_delta

Z_DIM, NUM_CLASSES = 10, 10


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _delta(scale: float, seed: int) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {"a": scale * torch.randn(3, 4, generator=g), "b": scale * torch.randn(5, generator=g)}


def _template() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in _delta(1.0, 0).items()}


def _states(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- deltas ------------------------------------------------------------------------------------


def test_delta_norm_is_whole_vector_l2() -> None:
    delta = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}
    assert delta_norm(delta) == pytest.approx(5.0)


def test_flatten_delta_keeps_float_buffers_and_skips_integer_counters() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    old = _states(model)
    model.train()
    model(torch.randn(8, 3, generator=_gen()))  # updates running stats and the counter
    delta = flatten_delta(old, model.state_dict())
    assert "1.running_mean" in delta and "1.running_var" in delta
    assert "1.num_batches_tracked" not in delta
    assert delta["1.running_mean"].abs().sum() > 0


def test_apply_delta_round_trips_flatten_delta() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    old = _states(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.train()
    model(torch.randn(8, 3, generator=_gen()))
    new = _states(model)
    model.load_state_dict(old)
    apply_delta(model, flatten_delta(old, new))
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, new[name])
    assert int(model.state_dict()["1.num_batches_tracked"]) == 0  # counter left alone


def test_apply_delta_rejects_mismatched_keys() -> None:
    with pytest.raises(ValueError, match="keys"):
        apply_delta(nn.Linear(2, 2), {"weight": torch.zeros(2, 2)})


# --- clipping ----------------------------------------------------------------------------------


def test_clip_bounds_large_delta_and_keeps_direction() -> None:
    delta = _delta(10.0, 0)
    clipped, was_clipped = clip_delta(delta, clip_norm=0.5)
    assert was_clipped
    assert delta_norm(clipped) == pytest.approx(0.5, rel=1e-6)
    ratio = clipped["a"] / delta["a"]
    torch.testing.assert_close(ratio, torch.full_like(ratio, 0.5 / delta_norm(delta)))


def test_clip_leaves_small_delta_untouched() -> None:
    delta = _delta(1e-3, 1)
    clipped, was_clipped = clip_delta(delta, clip_norm=1.0)
    assert not was_clipped
    for k in delta:
        assert torch.equal(clipped[k], delta[k])


@settings(max_examples=25, deadline=None)
@given(
    scale=st.floats(1e-6, 1e6),
    clip_norm=st.floats(1e-4, 1e3),
    seed=st.integers(0, 2**16),
)
def test_clipped_norm_never_exceeds_clip_norm(scale: float, clip_norm: float, seed: int) -> None:
    clipped, _ = clip_delta(_delta(scale, seed), clip_norm=clip_norm)
    assert delta_norm(clipped) <= clip_norm * (1 + 1e-6)


# --- aggregation -------------------------------------------------------------------------------


def test_noiseless_aggregate_is_sum_of_clipped_over_fixed_num_sampled() -> None:
    deltas = [_delta(10.0, 0), _delta(1e-3, 1), _delta(1.0, 2)]  # a fourth client never replied
    agg, info = aggregate_deltas(
        deltas, template=_template(), clip_norm=0.5, noise_multiplier=0.0, num_sampled=4, generator=_gen()
    )
    clipped = [clip_delta(d, clip_norm=0.5)[0] for d in deltas]
    for k in agg:
        torch.testing.assert_close(agg[k], sum(c[k] for c in clipped) / 4)
    assert (info.num_sampled, info.num_replied, info.num_clipped) == (4, 3, 2)
    assert info.noise_std == 0.0


def test_aggregate_noise_std_is_z_times_s_over_m() -> None:
    z, s, m = 2.0, 0.5, 4
    zero = {"w": torch.zeros(40_000)}
    agg, info = aggregate_deltas(
        [zero, zero], template=zero, clip_norm=s, noise_multiplier=z, num_sampled=m, generator=_gen(3)
    )
    expected = z * s / m
    assert info.noise_std == pytest.approx(expected)
    # Sample std of 40k normals has relative sd ~ 1/sqrt(2n) = 0.35%; 3% is > 8 sigma.
    assert float(agg["w"].std()) == pytest.approx(expected, rel=0.03)
    assert abs(float(agg["w"].mean())) < 5 * expected / math.sqrt(40_000)


def test_aggregate_noise_is_reproducible_from_the_generator() -> None:
    kwargs = dict(template=_template(), clip_norm=1.0, noise_multiplier=1.0, num_sampled=2)
    a, _ = aggregate_deltas([_delta(1.0, 0)], generator=_gen(7), **kwargs)
    b, _ = aggregate_deltas([_delta(1.0, 0)], generator=_gen(7), **kwargs)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_non_finite_delta_counts_as_zero_and_the_round_is_released() -> None:
    """Whether a client's local steps diverged depends on its data: dropping its delta (or the
    round) with a note would release that unaccounted. It counts as zero, the noise is added."""
    bad = _delta(1.0, 1)
    bad["b"][2] = float("nan")
    kwargs = dict(template=_template(), clip_norm=1.0, noise_multiplier=0.0, num_sampled=2, generator=_gen())
    agg, info = aggregate_deltas([_delta(1.0, 0), bad], **kwargs)
    alone, _ = aggregate_deltas([_delta(1.0, 0)], **kwargs)
    assert all(torch.equal(agg[k], alone[k]) for k in agg) and info.num_replied == 2


def test_poisson_rounds_take_any_number_of_replies_and_noise_an_empty_one() -> None:
    """Sampled with probability q, more than m = qK clients may reply, or none: the denominator
    stays m, and a round nobody answered still releases noise (its emptiness is not data-free)."""
    kwargs = dict(template=_template(), clip_norm=1.0, noise_multiplier=1.0, num_sampled=2)
    more, info = aggregate_deltas([_delta(1.0, 0)] * 3, generator=_gen(), **kwargs)
    assert info.num_replied == 3
    empty, info = aggregate_deltas([], generator=_gen(5), **kwargs)
    assert info.num_replied == 0 and all(float(v.abs().sum()) > 0 for v in empty.values())
    with pytest.raises(ValueError, match="shape"):
        aggregate_deltas([{"a": torch.zeros(2), "b": torch.zeros(5)}], generator=_gen(), **kwargs)


def test_privacy_event_is_poisson_with_sample_rate_m_over_k() -> None:
    _, info = aggregate_deltas(
        [_delta(1.0, 0)],
        template=_template(),
        clip_norm=1.0,
        noise_multiplier=0.7,
        num_sampled=10,
        generator=_gen(),
    )
    event = info.privacy_event(num_clients=1000)
    assert (event.noise_multiplier, event.sample_rate, event.count, event.sampling) == (0.7, 0.01, 1, "poisson")
