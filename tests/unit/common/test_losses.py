"""WGAN-GP critic loss, gradient penalty, critic step and the per-sample generator gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.learning.losses import (
    critic_loss,
    critic_step,
    generator_sample_grads,
    gradient_penalty,
)
from common.learning.models import build_discriminator, build_generator, sample_latent


class LinearCritic(nn.Module):
    """D(x, y) = <w, x> + b_y: its input gradient is w everywhere, for every label."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w.flatten().clone())
        self.b = nn.Parameter(torch.arange(10, dtype=torch.float32))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.w + self.b[y]


def _unit(seed: int = 0) -> torch.Tensor:
    w = torch.randn(784, generator=torch.Generator().manual_seed(seed))
    return w / w.norm()


def _images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_gradient_penalty_vanishes_for_unit_gradient_critic() -> None:
    real, y = _images(8, 0)
    fake, _ = _images(8, 1)
    gp = gradient_penalty(LinearCritic(_unit()), real, fake, y)
    assert gp.item() == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("norm", [0.0, 0.5, 2.0, 3.0])
def test_gradient_penalty_is_squared_distance_of_norm_from_one(norm: float) -> None:
    real, y = _images(8, 0)
    fake, _ = _images(8, 1)
    D = LinearCritic(norm * _unit())
    assert gradient_penalty(D, real, fake, y).item() == pytest.approx((norm - 1) ** 2, rel=1e-5)
    weighted = gradient_penalty(D, real, fake, y, weight=10.0)
    assert weighted.item() == pytest.approx(10 * (norm - 1) ** 2, rel=1e-5)


def test_gradient_penalty_backpropagates_into_critic_parameters() -> None:
    D = LinearCritic(2.0 * _unit())
    real, y = _images(4, 0)
    gradient_penalty(D, real, _images(4, 1)[0], y).backward()
    # d/dw (||w|| - 1)^2 = 2 (||w|| - 1) w / ||w|| = 2 * unit(w) for ||w|| = 2
    torch.testing.assert_close(D.w.grad, 2.0 * _unit())


def test_gradient_penalty_is_reproducible_with_a_generator() -> None:
    D = build_discriminator("tiny").eval()
    real, y = _images(4, 0)
    fake, _ = _images(4, 1)
    a = gradient_penalty(D, real, fake, y, generator=torch.Generator().manual_seed(3))
    b = gradient_penalty(D, real, fake, y, generator=torch.Generator().manual_seed(3))
    assert a.item() == b.item() and a.item() > 0


def test_critic_loss_formula_and_stats() -> None:
    D = LinearCritic(2.0 * _unit())
    real, real_y = _images(8, 0)
    fake, fake_y = _images(8, 1)
    loss, stats = critic_loss(D, real, real_y, fake, fake_y, gp_weight=10.0, drift=1e-3)
    with torch.no_grad():
        d_real, d_fake = D(real, real_y), D(fake, fake_y)
    expected = d_fake.mean() - d_real.mean() + 10.0 * 1.0 + 1e-3 * d_real.pow(2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert stats["wasserstein"] == pytest.approx((d_real.mean() - d_fake.mean()).item(), rel=1e-5)
    assert stats["gp"] == pytest.approx(1.0, rel=1e-5)
    assert stats["d_real"] == pytest.approx(d_real.mean().item(), rel=1e-5)
    assert stats["d_fake"] == pytest.approx(d_fake.mean().item(), rel=1e-5)
    assert stats["loss"] == pytest.approx(loss.item())


def test_critic_loss_does_not_reach_the_generator() -> None:
    torch.manual_seed(0)
    G, D = build_generator("tiny"), build_discriminator("tiny")
    y = torch.randint(0, 10, (4,))
    fake = G(sample_latent(4, 10), y)
    real, _ = _images(4, 0)
    loss, _ = critic_loss(D, real, y, fake, y)
    loss.backward()
    assert all(p.grad is None for p in G.parameters())
    assert all(p.grad is not None for p in D.parameters())


def test_critic_steps_separate_real_constant_images_from_noise() -> None:
    torch.manual_seed(0)
    D = build_discriminator("tiny")
    opt = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.9))
    y = torch.randint(0, 10, (8,))
    real = torch.full((8, 1, 28, 28), 0.8)
    g = torch.Generator().manual_seed(1)

    def noise() -> torch.Tensor:
        return torch.rand(8, 1, 28, 28, generator=g)

    first = critic_loss(D, real, y, noise(), y)[0].item()
    for _ in range(20):
        stats = critic_step(D, opt, real, y, noise(), y, gp_weight=10.0, drift=1e-3)
    assert set(stats) == {"wasserstein", "gp", "d_real", "d_fake", "loss"}
    fake = noise()  # fresh noise: D generalizes, it did not memorize its fake batches
    last, stats = critic_loss(D, real, y, fake, y)
    assert last.item() < first
    assert stats["wasserstein"] > 0.1
    with torch.no_grad():
        assert D(real, y).mean() > D(fake, y).mean()


def test_generator_sample_grads_equals_per_sample_loop() -> None:
    torch.manual_seed(0)
    D = build_discriminator("tiny").eval()
    fake, y = _images(5, 0)
    grads = generator_sample_grads(D, fake, y)
    assert grads.shape == fake.shape
    for i in range(5):
        xi = fake[i : i + 1].clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(-D(xi, y[i : i + 1]).sum(), xi)
        torch.testing.assert_close(grads[i : i + 1], gi, rtol=1e-5, atol=1e-7)


def test_generator_sample_grads_leaves_critic_and_generator_untouched() -> None:
    torch.manual_seed(0)
    G, D = build_generator("tiny"), build_discriminator("tiny")
    y = torch.randint(0, 10, (4,))
    fake = G(sample_latent(4, 10), y)
    grads = generator_sample_grads(D, fake, y)
    assert not grads.requires_grad
    assert all(p.grad is None for p in D.parameters())
    assert all(p.grad is None for p in G.parameters())
    fake.backward(grads / 4)  # the server's step: the graph of `fake` is still intact
    assert all(p.grad is not None for p in G.parameters())


def test_linear_critic_sample_grads_are_minus_w() -> None:
    w = 3.0 * _unit()
    fake, y = _images(3, 0)
    grads = generator_sample_grads(LinearCritic(w), fake, y)
    torch.testing.assert_close(grads, -w.view(1, 1, 28, 28).expand(3, 1, 28, 28))


def test_generator_follows_sample_grads_of_a_fixed_critic() -> None:
    # A critic rewarding brightness: G trained on its per-sample gradients must get brighter.
    torch.manual_seed(0)
    G = build_generator("tiny")
    D = LinearCritic(torch.full((784,), 1 / 28.0))
    opt = torch.optim.Adam(G.parameters(), lr=1e-2, betas=(0.5, 0.9))
    z, y = sample_latent(16, 10), torch.randint(0, 10, (16,))
    with torch.no_grad():
        start = G(z, y).mean().item()
    for _ in range(3):
        labels = torch.randint(0, 10, (16,))
        fake = G(sample_latent(16, 10), labels)
        opt.zero_grad(set_to_none=True)
        fake.backward(generator_sample_grads(D, fake, labels) / 16)
        opt.step()
    with torch.no_grad():
        assert G(z, y).mean().item() > start + 0.1
