"""Sanitizer: clipping bound, the size of the injected noise, the reported event, bad inputs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from common.privacy.sanitizer import (
    PrivacyEvent,
    clip_sample_grads,
    noise_generator,
    sanitize_sample_grads,
)


def _norms(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).norm(dim=1)


def test_injected_noise_has_std_two_sigma_c() -> None:
    """Zero gradients: the output is pure noise, which must be N(0, (2σC)²) per coordinate."""
    batch, dim, sigma, clip = 64, 4096, 1.07, 0.5
    out, _ = sanitize_sample_grads(
        torch.zeros(batch, dim), clip=clip, noise_multiplier=sigma, generator=noise_generator(0)
    )
    expected = 2 * sigma * clip
    assert out.std().item() == pytest.approx(expected, rel=0.02)  # 262k draws: SE ≈ 0.14%
    assert abs(out.mean().item()) < 0.01 * expected
    # independent per sample: per-sample stds agree too
    assert out.std(dim=1).min().item() > 0.9 * expected


def test_clipped_norms_at_most_c_and_small_ones_untouched() -> None:
    torch.manual_seed(0)
    grads = torch.randn(16, 3, 4, 4) * torch.logspace(-2, 2, 16).view(16, 1, 1, 1)
    out, _ = sanitize_sample_grads(grads, clip=1.0, noise_multiplier=0.0, generator=noise_generator(0))
    norms = _norms(out)
    assert bool((norms <= 1.0 + 1e-5).all())
    small = _norms(grads) <= 1.0
    assert bool(small.any()) and torch.equal(out[small], grads[small])
    assert torch.allclose(norms[~small], torch.ones(int((~small).sum())), atol=1e-5)
    # direction is kept
    cos = torch.nn.functional.cosine_similarity(out.reshape(16, -1), grads.reshape(16, -1), dim=1)
    assert bool((cos > 1 - 1e-5).all())


def test_zero_gradient_is_not_nan() -> None:
    out = clip_sample_grads(torch.zeros(3, 5), clip=1.0)
    assert torch.equal(out, torch.zeros(3, 5))


def test_event_is_one_query_at_sigma_over_sqrt_b() -> None:
    _, event = sanitize_sample_grads(torch.randn(32, 10), clip=1.0, noise_multiplier=1.07, generator=noise_generator(1))
    assert event == PrivacyEvent(noise_multiplier=1.07 / math.sqrt(32), sample_rate=1.0, count=1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gradients_are_zeroed_noised_and_charged(bad: float) -> None:
    """A diverged discriminator must not make the client raise an error that counts bad samples
    (a data-dependent, unaccounted release): the bad rows count as zero, the answer is noised and
    the event is the usual one."""
    grads = torch.randn(4, 6)
    grads[2, 3] = bad
    out, event = sanitize_sample_grads(grads, clip=1.0, noise_multiplier=0.0, generator=noise_generator(0))
    assert torch.equal(out[2], torch.zeros(6)) and bool(torch.isfinite(out).all())
    torch.testing.assert_close(out[[0, 1, 3]], clip_sample_grads(grads[[0, 1, 3]], clip=1.0))
    noisy, noisy_event = sanitize_sample_grads(grads, clip=1.0, noise_multiplier=1.0, generator=noise_generator(0))
    assert bool(torch.isfinite(noisy).all()) and float(noisy[2].abs().sum()) > 0
    assert noisy_event == PrivacyEvent(noise_multiplier=1.0 / 2.0, sample_rate=1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(clip=0.0, noise_multiplier=1.0),
        dict(clip=-1.0, noise_multiplier=1.0),
        dict(clip=1.0, noise_multiplier=-0.1),
        dict(clip=math.inf, noise_multiplier=1.0),
    ],
)
def test_invalid_parameters_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        sanitize_sample_grads(torch.randn(2, 3), generator=noise_generator(0), **kwargs)


@pytest.mark.parametrize("grads", [torch.ones(2, 3, dtype=torch.int64), torch.ones(0, 3)])
def test_integer_or_empty_gradients_raise(grads: torch.Tensor) -> None:
    with pytest.raises(ValueError):
        sanitize_sample_grads(grads, clip=1.0, noise_multiplier=1.0, generator=noise_generator(0))


def test_privacy_parameters_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        sanitize_sample_grads(torch.randn(2, 3), 1.0, 1.0, noise_generator(0))  # type: ignore[misc]


def test_fixed_seed_reproduces_and_secret_seeds_differ() -> None:
    grads = torch.randn(8, 5)
    kw = dict(clip=1.0, noise_multiplier=1.0)
    a, _ = sanitize_sample_grads(grads, generator=noise_generator(7), **kw)
    b, _ = sanitize_sample_grads(grads, generator=noise_generator(7), **kw)
    assert torch.equal(a, b)
    g1, g2 = noise_generator(), noise_generator()
    assert g1.initial_seed() != g2.initial_seed()
    c, _ = sanitize_sample_grads(grads, generator=g1, **kw)
    assert not torch.equal(a, c)


def test_output_is_detached_and_keeps_dtype() -> None:
    grads = torch.randn(4, 3, requires_grad=True)
    out, _ = sanitize_sample_grads(grads * 2, clip=1.0, noise_multiplier=1.0, generator=noise_generator(0))
    assert not out.requires_grad and out.dtype == torch.float32
    half, _ = sanitize_sample_grads(
        torch.randn(4, 3).half(), clip=1.0, noise_multiplier=1.0, generator=noise_generator(0)
    )
    assert half.dtype == torch.float16 and bool(torch.isfinite(half).all())


def test_event_dict_round_trip_and_validation() -> None:
    event = PrivacyEvent(noise_multiplier=0.25, sample_rate=1.0, count=3)
    assert PrivacyEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
    assert event.astuple() == (0.25, 1.0, 3)
    for bad in [
        dict(noise_multiplier=-1.0, sample_rate=1.0),
        dict(noise_multiplier=1.0, sample_rate=2.0),
        dict(noise_multiplier=1.0, sample_rate=1.0, count=0),
    ]:
        with pytest.raises(ValueError):
            PrivacyEvent(**bad)
