"""WGAN-GP losses of GS-WGAN and the per-sample generator gradient a client releases.

The critic objective (Gulrajani et al. 2017, plus the drift term of Karras et al. 2018):

    L_D = E[D(fake)] - E[D(real)] + lambda * E[(||grad_x D(x_hat)||_2 - 1)^2] + drift * E[D(real)^2]

with x_hat a uniform random interpolate of a real and a fake sample. The generator's upstream
gradient is ``d(-D(x_i, y_i)) / d x_i`` per sample; GS-WGAN clips and noises it on the client
(``common/privacy``), which is why the discriminator must treat samples independently.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _per_sample_norm(g: Tensor) -> Tensor:
    return g.flatten(1).norm(2, dim=1)


def draw_alpha(batch_size: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The penalty's interpolation weights ``[B, 1, 1, 1]`` ~ U[0, 1], drawn from ``generator`` where
    it lives (a client's data RNG stays on the CPU whatever the device, ``common/device.py``), then
    moved to ``device``. Callers that draw them ahead of the step (a CUDA-graph replay) use this
    too, so the stream is consumed the same way."""
    where = generator.device if generator is not None else device
    return torch.rand((batch_size, 1, 1, 1), generator=generator, device=where).to(device)


def gradient_penalty(
    D: nn.Module,
    real: Tensor,
    fake: Tensor,
    y: Tensor,
    *,
    weight: float = 1.0,
    generator: torch.Generator | None = None,
    alpha: Tensor | None = None,
) -> Tensor:
    """``weight * mean_i (||grad_x D(x_hat_i, y_i)||_2 - 1)^2`` on random interpolates.

    ``x_hat_i = a_i * real_i + (1 - a_i) * fake_i`` with ``a_i ~ U[0, 1]``: ``alpha`` if given
    (``draw_alpha``'s shape), else drawn from ``generator``. The graph is kept (``create_graph=True``)
    so the penalty can be backpropagated into D's parameters.
    """
    if alpha is None:
        alpha = draw_alpha(real.shape[0], generator, real.device).view(-1, *([1] * (real.dim() - 1)))
    x_hat = (alpha * real.detach() + (1 - alpha) * fake.detach()).requires_grad_(True)
    (grad,) = torch.autograd.grad(D(x_hat, y).sum(), x_hat, create_graph=True)
    return weight * (_per_sample_norm(grad) - 1).pow(2).mean()


def critic_loss(
    D: nn.Module,
    real: Tensor,
    real_y: Tensor,
    fake: Tensor,
    fake_y: Tensor,
    *,
    gp_weight: float = 10.0,
    drift: float = 1e-3,
    generator: torch.Generator | None = None,
    alpha: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """WGAN-GP critic loss (to minimize) and its statistics.

    ``fake`` is detached: this loss never reaches the generator. The gradient penalty is taken
    at the real samples' labels. (The official code draws fake labels equal to the real ones, so
    the two coincide there; in GS-WGAN proper the server draws fake labels uniformly, and the
    penalty then constrains ``D(., real_y)`` on the segment from the real sample to a fake one.)

    Stats (detached 0-dim tensors): ``wasserstein`` (E[D(real)] - E[D(fake)]), ``gp``
    (unweighted), ``d_real``, ``d_fake``, ``loss``.
    """
    fake = fake.detach()
    # Real and fake in one forward: D treats samples independently, and one call is cheaper
    # (and runs spectral norm's power iteration once instead of twice).
    scores = D(torch.cat([real, fake]), torch.cat([real_y, fake_y]))
    d_real, d_fake = scores[: real.shape[0]], scores[real.shape[0] :]
    gp = gradient_penalty(D, real, fake, real_y, generator=generator, alpha=alpha)
    loss = d_fake.mean() - d_real.mean() + gp_weight * gp + drift * d_real.pow(2).mean()
    # 0-dim tensors, not floats: reading one is a host sync on a GPU, and most steps never do.
    stats = {
        "wasserstein": d_real.detach().mean() - d_fake.detach().mean(),
        "gp": gp.detach(),
        "d_real": d_real.detach().mean(),
        "d_fake": d_fake.detach().mean(),
        "loss": loss.detach(),
    }
    return loss, stats


def critic_step(
    D: nn.Module,
    optimizer: torch.optim.Optimizer,
    real: Tensor,
    real_y: Tensor,
    fake: Tensor,
    fake_y: Tensor,
    *,
    gp_weight: float = 10.0,
    drift: float = 1e-3,
    generator: torch.Generator | None = None,
    alpha: Tensor | None = None,
) -> dict[str, Tensor]:
    """One optimizer step of D on ``critic_loss``; returns its statistics (before the step)."""
    optimizer.zero_grad(set_to_none=True)
    loss, stats = critic_loss(
        D, real, real_y, fake, fake_y, gp_weight=gp_weight, drift=drift, generator=generator, alpha=alpha
    )
    loss.backward()
    optimizer.step()
    return stats


def generator_sample_grads(D: nn.Module, fake: Tensor, y: Tensor) -> Tensor:
    """Per-sample ``g_i = d(-D(x_i, y_i)) / d x_i``, shaped like ``fake``.

    Because D never mixes samples, the gradient of the summed score w.r.t. the batch is exactly
    the stack of per-sample gradients. Computed on a detached copy with ``torch.autograd.grad``,
    so neither D's parameter ``.grad`` nor the generator's graph is touched. (In training mode
    D's spectral norm still advances its power iteration, which depends on D's weights only.)
    """
    x = fake.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(-D(x, y).sum(), x)
    return grad
