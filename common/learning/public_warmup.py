"""dpGAN's warm start from public data (Zhang et al. 2018): G and D trained without noise on data
declared public (``--public-data``, ``common/data/public.py``) before any private step.

Costs no privacy: nothing private enters it. Every method uses it where its networks live (GS-WGAN:
the server's G, with a public D that is then discarded, and each client's D before its own warm
start; DPGAN: the curator's G and D; Fed-Avg GAN: the server's G and the first global D). The
EMA of G starts from the warmed G. The privacy statement names the public data (``statement.public_data_sentence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.learning.losses import critic_step
from common.learning.models import GeneratorEMA, sample_latent

if TYPE_CHECKING:
    from common.run_options import RunOptions


_PUBLIC: dict[str, tuple[Tensor, Tensor]] = {}  # public_key -> tensors: the last public set, per process


def public_tensors(cfg: RunOptions) -> tuple[Tensor, Tensor]:
    """The public examples as float ``[n, 1, 28, 28]`` in [0, 1] and int64 labels (cached per process),
    converted exactly as a client's partition is (``client_data_from_arrays``)."""
    key = public_key(cfg)
    if key not in _PUBLIC:
        from common.data import client_data_from_arrays
        from common.data.public import public_arrays

        data = client_data_from_arrays(*public_arrays(cfg), client_id=-1, inverted=False)
        _PUBLIC.clear()
        _PUBLIC[key] = (data.images, data.labels)
    return _PUBLIC[key]


def public_key(cfg: RunOptions) -> str:
    """The config fields the public set depends on."""
    return repr(
        (
            cfg.public_data,
            cfg.public_size,
            cfg.dataset,
            cfg.data_dir,
            cfg.emnist_split,
            cfg.seed,
            cfg.partition,
            cfg.num_clients,
            cfg.synthetic_samples_per_writer,
        )
    )


def public_batch(cfg: RunOptions, n: int, rng: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor]:
    """``n`` public examples drawn uniformly (with the caller's public RNG)."""
    images, labels = public_tensors(cfg)
    idx = torch.randint(len(labels), (n,), generator=rng)
    return images[idx].to(device), labels[idx].to(device)


def pretrain_gan(
    G: nn.Module,
    D: nn.Module,
    d_optimizer: torch.optim.Optimizer,
    cfg: RunOptions,
    *,
    steps: int,
    n_critic: int,
    num_classes: int,
    rng: torch.Generator,
    lr: float,
    loss: str = "wgan-gp",
) -> None:
    """``steps`` generator steps on public data, each after ``n_critic`` steps of D (WGAN-GP, or the
    non-saturating loss for a DPGAN discriminator). G gets a fresh Adam (its private optimizer state
    starts clean); D keeps the caller's optimizer."""
    device = next(G.parameters()).device
    g_opt = torch.optim.Adam(G.parameters(), lr=lr, betas=(cfg.beta1, cfg.beta2))
    B = cfg.batch_size
    for _ in range(steps):
        for _ in range(max(n_critic, 1)):
            real, real_y = public_batch(cfg, B, rng, device)
            y = torch.randint(num_classes, (B,), generator=rng).to(device)
            with torch.no_grad():
                fake = G(sample_latent(B, cfg.z_dim, generator=rng).to(device), y)
            if loss == "wgan-gp":
                critic_step(
                    D, d_optimizer, real, real_y, fake, y, gp_weight=cfg.gp_weight, drift=cfg.drift, generator=rng
                )
            else:
                d_optimizer.zero_grad(set_to_none=True)
                (F.softplus(-D(real, real_y)).mean() + F.softplus(D(fake, y)).mean()).backward()
                d_optimizer.step()
        y = torch.randint(num_classes, (B,), generator=rng).to(device)
        fake = G(sample_latent(B, cfg.z_dim, generator=rng).to(device), y)
        score = D(fake, y)
        g_loss = -score.mean() if loss == "wgan-gp" else F.softplus(-score).mean()
        g_opt.zero_grad(set_to_none=True)
        g_loss.backward()
        g_opt.step()
    d_optimizer.zero_grad(set_to_none=True)


def warm_gan_on_public(
    G: nn.Module,
    D: nn.Module,
    cfg: RunOptions,
    *,
    num_classes: int,
    rng: torch.Generator,
    lr_g: float,
    lr_d: float,
    n_critic: int,
) -> GeneratorEMA:
    """The servers' warm start (GS-WGAN's G against a throwaway D, Fed-Avg's G and first global D):
    WGAN-GP with a fresh Adam for D (learning rate ``lr_d``; G's ``lr_g``), ``n_critic`` steps of D
    per step of G. Returns the EMA of G restarted from the warmed G (the released model must not
    average in the untrained start)."""
    d_opt = torch.optim.Adam(D.parameters(), lr=lr_d, betas=(cfg.beta1, cfg.beta2))
    pretrain_gan(
        G, D, d_opt, cfg, steps=cfg.public_warmup_steps, n_critic=n_critic, num_classes=num_classes, rng=rng, lr=lr_g
    )
    return GeneratorEMA(G, decay=cfg.ema_decay)
