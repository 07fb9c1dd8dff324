"""A Fed-Avg GAN client's round: up to ``local_steps`` SGD steps on the received D against the frozen
G; the raw delta goes back (the server clips and noises it, so the client's own ledger records it
as a release without noise)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from common.learning.losses import critic_step
from common.learning.models import build_discriminator, build_generator, device_of, on_cpu, sample_latent

from .dp_fedavg import Delta, flatten_delta, weights_only

CLIENT_OPTIMIZERS = ("sgd", "adam")
DELTA_SCOPES = ("state", "weights")


def local_optimizer(params, name: str, *, lr: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    """The client's optimizer of D, fresh each round: SGD as in Augenstein et al., or Adam (its
    moments start from zero every round: a client keeps nothing between rounds)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas)
    raise ValueError(f"unknown client optimizer {name!r}, choose one of {CLIENT_OPTIMIZERS}")


@torch.no_grad()
def _fakes(G: nn.Module, n: int, *, z_dim: int, num_classes: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` fakes from the frozen G with uniformly drawn labels."""
    device = device_of(G)
    y = torch.randint(0, num_classes, (n,), generator=generator).to(device)
    return G(sample_latent(n, z_dim, generator=generator).to(device), y), y


def client_update(
    G_state: dict[str, Tensor],
    D_state: dict[str, Tensor],
    *,
    preset: str,
    num_classes: int,
    z_dim: int,
    real_images: Tensor,
    real_labels: Tensor,
    local_steps: int = 6,
    lr: float = 5e-4,
    batch_size: int = 32,
    gp_weight: float = 10.0,
    drift: float = 1e-3,
    optimizer: str = "sgd",
    betas: tuple[float, float] = (0.5, 0.9),
    scope: str = "state",
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> Delta:
    """One client's round: up to ``local_steps`` SGD steps on D, returns its raw D delta.

    "Up to": one shuffled pass over the local data, stopping after ``local_steps`` batches (the
    last batch may be smaller), as in Augenstein et al. G is rebuilt from ``G_state`` and used in
    eval mode under ``no_grad``, so it is never changed. The delta covers D's whole state,
    buffers included (see :func:`flatten_delta`); clipping and noise happen on the server. The
    networks train on ``device``; ``generator`` (the round's public seed) stays on the CPU and the
    delta comes back on the CPU, ready for the wire. ``optimizer`` (``local_optimizer``) and
    ``scope``: ``state`` (every floating-point entry) or ``weights`` (parameters only, see
    :func:`weights_only`) are Fed-Avg's levers; the defaults are the paper's.
    """
    if scope not in DELTA_SCOPES:
        raise ValueError(f"unknown delta scope {scope!r}, choose one of {DELTA_SCOPES}")
    if real_images.shape[0] != real_labels.shape[0] or real_images.shape[0] == 0:
        raise ValueError("real_images and real_labels must be non-empty and equally long")
    G = build_generator(preset, z_dim=z_dim, num_classes=num_classes).to(device)
    G.load_state_dict(G_state)
    G.eval().requires_grad_(False)
    D = build_discriminator(preset, num_classes=num_classes).to(device)
    D.load_state_dict(D_state)
    D.train()
    opt = local_optimizer(D.parameters(), optimizer, lr=lr, betas=betas)
    order = torch.randperm(real_images.shape[0], generator=generator)
    for batch in order.split(batch_size)[:local_steps]:
        fake, fake_y = _fakes(G, len(batch), z_dim=z_dim, num_classes=num_classes, generator=generator)
        real, real_y = real_images[batch].to(device), real_labels[batch].to(device)
        critic_step(
            D,
            opt,
            real,
            real_y,
            fake,
            fake_y,
            gp_weight=gp_weight,
            drift=drift,
            generator=generator,
        )
    delta = flatten_delta(D_state, D.state_dict())
    return on_cpu(weights_only(delta, D) if scope == "weights" else delta)
