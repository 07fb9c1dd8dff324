"""DPAC, the dual-purpose auxiliary classifier (Chen, Liu, Ma, Nepal, Xu, CVPR 2023): a third player.

Beside D, a classifier C learns the data's classes, and G is trained against

    β · (WGAN term: −D(G(z, y), y)) + (1 − β) · CE(C(G(z, y)), y)

so that a generated sample is pushed both towards the data and towards its conditioning class.
C learns from real data (the *reversed* utility, real2gen: a classifier of real data must
recognise the fakes) and from generated data (the *standard* utility, gen2real: what is learned
from fakes must hold on real data), "sequentially": one step on real data, then one on the fakes
(``TRAIN_MODES``; the paper's ablation drops one source or trains on both in one step, and its
"init" pretrains C on real data before the GAN starts). The poster in ``papers/`` gives the loss
and the ablation table, not the step schedule; the schedule here is our reading of it.

Privacy. Only the generator's gradient ever leaves: in federated GS-WGAN each client keeps C_k
next to D_k, and the per-sample gradient of the *combined* loss with respect to each generated
sample is clipped and noised once, as before, so the query's sensitivity and ε are unchanged and
C_k (trained on the client's data without noise) is never released; in centralized DPGAN C is
trained with DP-SGD like D, and its steps are charged to the curator's ledger.

Framework-free; methods call these functions from their own slices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.learning.losses import generator_sample_grads
from common.learning.models import IMAGE_SHAPE, PRESET_SPECS

TRAIN_MODES = ("seq", "joint", "real", "fake")
TRAIN_HELP = (
    "seq (a step on a real batch, then one on the generated batch: the paper's sequential training), "
    "joint (one step on both: the ablation 'w/o seq'), real (real data only: 'w/o g2r'), "
    "fake (generated data only, after the init on real data: 'w/o r2g')"
)


class AuxClassifier(nn.Module):
    """The discriminator's conv trunk (its preset's widths, no spectral norm) with a class head.

    Its own architecture, not the evaluation's (``DomainClassifier``): G must not be trained
    against the very network family that grades it. No BatchNorm, so a sample's logits never
    depend on the rest of its batch and per-sample gradients are exact.
    """

    def __init__(self, channels: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.convs = nn.ModuleList(
            nn.Conv2d(c_in, c_out, 5, stride=2, padding=2) for c_in, c_out in ((IMAGE_SHAPE[0], c1), (c1, c2), (c2, c3))
        )
        self.head = nn.Linear(c3 * 4 * 4, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(x.shape[0], *IMAGE_SHAPE)
        for conv in self.convs:
            h = F.leaky_relu(conv(h), 0.2)
        return self.head(h.flatten(1))


def build_classifier(preset: str, *, num_classes: int) -> AuxClassifier:
    """The auxiliary classifier of model ``preset`` (as wide as its discriminator)."""
    return AuxClassifier(PRESET_SPECS[preset][1].channels, num_classes)


def classifier_adam(classifier: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam with its usual betas: C is an ordinary classifier, not a GAN player with a moving target."""
    return torch.optim.Adam(classifier.parameters(), lr=lr)


def classifier_step(C: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    """One cross-entropy step of C on (x, y); returns the loss before the step (a 0-dim tensor)."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(C(x.detach()), y.long())
    loss.backward()
    optimizer.step()
    return loss.detach()


# Modes in which C learns from real data (in centralized DPAC, each such step is a charged DP step).
REAL_DATA_MODES = ("seq", "joint", "real")


def run_mode(mode: str, *, real: Callable[[], object], fake: Callable[[], object], joint: Callable[[], object]) -> None:
    """C's share of one critic step as ``mode`` says, given how to take a step on real data, on the
    generated data, and on both at once: the one place that says what each mode means (the client's
    non-private C and the curator's DP-SGD C both dispatch here)."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"unknown DPAC training mode {mode!r}; choose one of {', '.join(TRAIN_MODES)}")
    if mode in ("seq", "real"):
        real()
    if mode == "joint":
        joint()
    if mode in ("seq", "fake"):
        fake()


def train_classifier(
    C: nn.Module,
    optimizer: torch.optim.Optimizer,
    mode: str,
    real: Tensor,
    real_y: Tensor,
    fake: Tensor,
    fake_y: Tensor,
) -> None:
    """C's share of one critic step on a client (no noise: C is never released)."""
    run_mode(
        mode,
        real=lambda: classifier_step(C, optimizer, real, real_y),
        fake=lambda: classifier_step(C, optimizer, fake, fake_y),
        joint=lambda: classifier_step(C, optimizer, torch.cat([real, fake.detach()]), torch.cat([real_y, fake_y])),
    )


def combined_sample_grads(D: nn.Module, C: nn.Module | None, fake: Tensor, y: Tensor, beta: float) -> Tensor:
    """Per-sample ``g_i = d/dx_i [β·(−D(x_i, y_i)) + (1−β)·CE(C(x_i), y_i)]``, shaped like ``fake``.

    Neither network mixes samples, so the gradient of the summed loss is the stack of per-sample
    gradients (one backward pass). β = 1 (or no C) is GS-WGAN's ``d(−D)/dx`` exactly.
    """
    if C is None or beta >= 1:
        return generator_sample_grads(D, fake, y)
    x = fake.detach().requires_grad_(True)
    loss = beta * -D(x, y).sum() + (1 - beta) * F.cross_entropy(C(x), y.long(), reduction="sum")
    (grad,) = torch.autograd.grad(loss, x)
    return grad
