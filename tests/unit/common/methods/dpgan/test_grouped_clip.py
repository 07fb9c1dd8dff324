"""dpGAN's grouped clipping, accounted correctly: the clip per group by hand, the noise that the
bounds imply (a test that fails if the bounds are not reflected in the noise), and the ε."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from common.methods.dpgan.dpsgd import DpDiscriminatorTrainer
from common.methods.dpgan.grouped_clip import equal_bounds, parameter_groups, scaled_bounds

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook")


class AffineCritic(nn.Module):
    """D(x) = w·x + b: per-row NS gradients are -(1-σ(s))·(x, 1) for real rows, σ(s)·(x, 1) for fakes."""

    def __init__(self, dim: int = 2) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, 1)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.lin(x).squeeze(1)


def _trainer(D: nn.Module, **kw) -> DpDiscriminatorTrainer:
    args = dict(
        lr=1e-3,
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        sample_rate=0.1,
        expected_batch_size=4,
        generator=torch.Generator().manual_seed(0),
        grouping="weight-bias",
    )
    args.update(kw)
    return DpDiscriminatorTrainer(D, **args)


def test_groups_split_weights_from_biases_or_by_tensor():
    D = AffineCritic()
    wb = parameter_groups(D, "weight-bias")
    assert [len(g) for g in wb] == [1, 1] and wb[0][0] is D.lin.weight and wb[1][0] is D.lin.bias
    assert len(parameter_groups(D, "layer")) == 2 and len(parameter_groups(D, "none")) == 1


def test_each_group_of_each_row_is_clipped_to_its_bound_by_hand():
    torch.manual_seed(0)
    D = AffineCritic()
    trainer = _trainer(D, max_grad_norm=0.5)
    trainer.optimizer.set_bounds([0.4, 0.3])  # √(0.16 + 0.09) = 0.5
    real, fake = 3 * torch.randn(3, 2), 3 * torch.randn(4, 2)
    w, b = D.lin.weight.detach()[0].clone(), D.lin.bias.detach().clone()
    s_real, s_fake = real @ w + b, fake @ w + b
    coef = torch.cat([-(1 - torch.sigmoid(s_real)), torch.sigmoid(s_fake)])
    x = torch.cat([real, fake])
    gw, gb = coef[:, None] * x, coef[:, None]
    fw = (0.4 / (gw.norm(dim=1) + 1e-6)).clamp(max=1.0)
    fb = (0.3 / (gb.norm(dim=1) + 1e-6)).clamp(max=1.0)
    trainer.step(real, torch.zeros(3), fake, torch.zeros(4))
    torch.testing.assert_close(D.lin.weight.grad[0], (fw[:, None] * gw).sum(0) / 8)
    torch.testing.assert_close(D.lin.bias.grad, (fb[:, None] * gb).sum(0) / 8)


@pytest.mark.parametrize("form", ["isotropic", "proportional"])
def test_the_noise_reflects_every_groups_bound(form):
    """Zero gradients: p.grad is pure noise. Isotropic: σ·√ΣC_j² everywhere; proportional: σ·√G·C_j
    on group j. Noise for one group's bound alone (the published error) fails here."""
    dim, sigma = 40_000, 1.5
    D = AffineCritic(dim)
    trainer = _trainer(D, noise_multiplier=sigma, max_grad_norm=1.0, noise_form=form, expected_batch_size=2)
    bounds = [0.8, 0.6]  # total 1.0
    trainer.optimizer.set_bounds(bounds)
    zeros = torch.zeros(3, dim)
    with torch.no_grad():
        D.lin.weight.zero_()
        D.lin.bias.fill_(-50.0)  # σ(s) ≈ 0 for fakes, real rows' gradient -(1-σ(s))·x = -x = 0
    trainer.step(zeros, torch.zeros(3), zeros[:0], torch.zeros(0))
    std_w = float(D.lin.weight.grad.std() * 2 * 2)
    expected_w = sigma * (1.0 if form == "isotropic" else math.sqrt(2) * 0.8)
    assert abs(std_w - expected_w) < 0.03 * expected_w
    expected_b = sigma * (1.0 if form == "isotropic" else math.sqrt(2) * 0.6)
    assert trainer.optimizer.noise_std(D.lin.bias) == pytest.approx(expected_b)
    assert trainer.optimizer.total_bound == pytest.approx(1.0)


def test_the_proportional_form_has_whitened_sensitivity_one():
    """Any gradient obeying the group bounds, divided group-wise by √G·C_j, has norm ≤ 1: with noise
    σ·√G·C_j on group j it is one Gaussian mechanism of noise multiplier σ (the ledger's event)."""
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        groups = int(torch.randint(1, 6, (1,), generator=g))
        bounds = (torch.rand(groups, generator=g) + 0.01).tolist()
        rows = [torch.randn(int(torch.randint(1, 9, (1,), generator=g)), generator=g) for _ in bounds]
        clipped = [r * min(1.0, c / float(r.norm())) for r, c in zip(rows, bounds, strict=True)]
        whitened = math.sqrt(sum(float(r.norm()) ** 2 / (groups * c * c) for r, c in zip(clipped, bounds, strict=True)))
        assert whitened <= 1 + 1e-6


def test_bounds_scale_to_the_total():
    assert math.sqrt(sum(b * b for b in equal_bounds(2.0, 4))) == pytest.approx(2.0)
    b = scaled_bounds([3.0, 4.0], 1.0)
    assert b == pytest.approx([0.6, 0.8])


def test_public_bounds_follow_the_median_norms_and_keep_the_total():
    torch.manual_seed(0)
    D = AffineCritic(3)
    trainer = _trainer(D, max_grad_norm=2.0, noise_multiplier=1.0)
    real, fake = torch.randn(16, 3), torch.randn(16, 3)
    w, b = D.lin.weight.detach()[0].clone(), D.lin.bias.detach().clone()
    coef = torch.cat([-(1 - torch.sigmoid(real @ w + b)), torch.sigmoid(fake @ w + b)])
    median_w = (coef[:, None] * torch.cat([real, fake])).norm(dim=1).median()
    median_b = coef.abs().median()
    bounds = trainer.set_public_bounds(real, torch.zeros(16), fake, torch.zeros(16))
    assert math.sqrt(sum(x * x for x in bounds)) == pytest.approx(2.0)
    assert bounds[0] / bounds[1] == pytest.approx(float(median_w / median_b), rel=1e-4)
    assert trainer.steps_taken == 0 and all(getattr(p, "grad_sample", None) is None for p in D.parameters())
