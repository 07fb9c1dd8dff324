"""What stage 2 starts from: the seed release and everything the server derives from it.

All of it is post-processing of stage 1's release (costs no privacy): the generator the server
fitted to the released embedding (its EMA, as stage 1 released it), the embedding itself (the GAN
keeps fitting it beside the clients' gradients: ``SeedAnchor``), and a critic the server trains on
that generator's samples (``server_critic``), from which each client's discriminator starts.
Measured (``bench/critic_warm_start.py``): that start is worth at most a few tens of iterations of a
client's own warm start; the hundreds to a thousand it needs on its data stay (the server knows only the
seed's samples, which its critic must call real).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from common.learning.losses import critic_step
from common.learning.models import GeneratorEMA, build_discriminator, build_generator, sample_latent

from .stage import seed_config

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

ANCHOR_STREAM = 0x5EED  # the anchor's latents: the run's seed plus this (public)
CRITIC_STREAM = 0xC417  # the server critic's draws and its throwaway generator's weights


@dataclass
class SeedStart:
    """Stage 1's outcome as stage 2 uses it (tensors on the CPU)."""

    generator: dict[str, Tensor]  # the released generator of stage 1 (the EMA of the fitted G)
    target: Tensor  # the released embedding: the mean of the accepted releases, [classes, row]
    releases: int  # how many clients' releases that mean holds
    critic: dict[str, Tensor] | None = None  # the server's critic (``server_critic``), or None
    derive_s: float = 0.0  # wall seconds its derivation took (the critic's training), kept for a resume

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator,
            "target": self.target,
            "releases": self.releases,
            "critic": self.critic,
            "derive_s": self.derive_s,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SeedStart:
        derive_s = float(state.get("derive_s", 0.0))  # absent from files written before it was kept
        return cls(state["generator"], state["target"], int(state["releases"]), state.get("critic"), derive_s)


def start_generator(
    cfg: ExperimentConfig, start: SeedStart, model: nn.Module, device: torch.device
) -> tuple[GeneratorEMA, SeedAnchor | None]:
    """Every seeded GAN's start: ``model`` loads the generator stage 1 released, its EMA restarts from
    it, and with ``init_weight`` > 0 the anchor to the seed release. Post-processing: no privacy cost."""
    model.load_state_dict(start.generator)
    anchor = SeedAnchor(cfg, start, device) if cfg.init_weight > 0 else None
    return GeneratorEMA(model, decay=cfg.ema_decay), anchor


def start_from_checkpoint(checkpoint: dict[str, Any]) -> SeedStart:
    """The seed from stage 1's last checkpoint: its released generator and its fitted target."""
    fitted = checkpoint["strategy"]["generator"]
    if fitted.get("target") is None:
        raise ValueError("the seed stage released nothing the generator could be fitted to (no target)")
    return SeedStart(checkpoint["released_generator"], fitted["target"].cpu(), int(fitted["releases"]))


class SeedAnchor:
    """The seed release's fit, added to every generator step of stage 2 with weight ``init_weight``:
    DP-MERF's (or DP-NTK's) embedding distance between G's samples and the released embedding. The
    noisy critic gradients sharpen G; the anchor keeps the class structure the seed released."""

    def __init__(self, cfg: ExperimentConfig, start: SeedStart, device: torch.device) -> None:
        from common.methods import method
        from common.methods.dp_merf.generator import embedding_loss

        self.first = seed_config(cfg)
        self.weight = cfg.init_weight
        self.fmap = method(cfg.init_release).family.build(self.first, device)
        self.target = start.target.to(device)
        self.rng = torch.Generator().manual_seed(cfg.seed + ANCHOR_STREAM)
        self._loss = embedding_loss

    def backward(self, model: nn.Module) -> float:
        """Add the weighted anchor's gradient to ``model``'s; returns the (unweighted) distance."""
        loss = self._loss(model, self.fmap, self.target, self.first, self.rng)
        (self.weight * loss).backward()
        return float(loss.detach())

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.set_state(state["rng"])


def server_critic(cfg: ExperimentConfig, start: SeedStart, num_classes: int) -> dict[str, Tensor]:
    """A WGAN-GP critic trained by the server for ``init_critic_steps`` steps with the seed
    generator's samples as its real data, against a throwaway generator trained alongside (as a
    client's warm start does with its own data; every ``n_critic`` critic steps one step of the
    throwaway G). Deterministic in the run's seed, so a resumed run derives the same critic."""
    rng = torch.Generator().manual_seed(cfg.seed + CRITIC_STREAM)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + CRITIC_STREAM)
        seed_g = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        throwaway = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        D = build_discriminator(cfg.model, num_classes=num_classes)
    seed_g.load_state_dict(start.generator)
    seed_g.eval().requires_grad_(False)
    d_opt = torch.optim.Adam(D.parameters(), lr=cfg.lr_d, betas=(cfg.beta1, cfg.beta2))
    g_opt = torch.optim.Adam(throwaway.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2))
    B, period = cfg.batch_size, max(cfg.n_critic, 1)
    for it in range(cfg.init_critic_steps):
        if it % period == 0:
            y = torch.randint(num_classes, (B,), generator=rng)
            fake = throwaway(sample_latent(B, cfg.z_dim, generator=rng), y)
        real_y = torch.randint(num_classes, (B,), generator=rng)
        with torch.no_grad():
            real = seed_g(sample_latent(B, cfg.z_dim, generator=rng), real_y)
        critic_step(D, d_opt, real, real_y, fake.detach(), y, gp_weight=cfg.gp_weight, drift=cfg.drift, generator=rng)
        if (it + 1) % period == 0:
            g_opt.zero_grad(set_to_none=True)
            (-D(fake, y).mean()).backward()
            g_opt.step()
    return {name: t.detach().clone() for name, t in D.state_dict().items()}
