"""DP-MERF's server side, the model: G, its EMA (released), Adam, and the target it is fitted to."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from common.device import resolve_device
from common.learning.models import GeneratorEMA, build_generator, sample_latent

from .features import FeatureFamily, SummaryFeatures

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


class MerfGenerator:
    """G, its EMA (released), Adam, and the target it is fitted to: the mean of the noisy summaries."""

    def __init__(self, cfg: ExperimentConfig, num_classes: int, family: FeatureFamily) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.model = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(self.device)
        self.ema = GeneratorEMA(self.model, decay=cfg.ema_decay)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.merf_lr, betas=(0.9, 0.999))
        self.fmap = family.build(cfg, self.device)
        self.rng = torch.Generator().manual_seed(cfg.seed)  # public: the latents
        self.target: Tensor | None = None
        self.releases = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_classes, self.fmap.dim)

    def start_from(self, weights: dict[str, Tensor]) -> None:
        """G's weights from elsewhere (a curator's G that a seed is fitted from), its EMA restarted at
        them: the EMA the construction made tracks the discarded initial weights."""
        self.model.load_state_dict(weights)
        self.ema = GeneratorEMA(self.model, decay=self.cfg.ema_decay)

    def set_target(self, releases: list[Tensor]) -> None:
        """The target: the mean of the accepted noisy summaries (the count is public to the server)."""
        self.set_mean(torch.stack(releases).mean(dim=0), len(releases))

    def set_mean(self, mean: Tensor, count: int) -> None:
        """The target given as a mean already (a secure sum's total over its ``count`` inputs)."""
        if tuple(mean.shape) != self.shape:
            raise ValueError(f"a target of shape {tuple(mean.shape)}, expected {self.shape}")
        self.target = mean.to(self.device)
        self.releases = int(count)

    def class_weights(self) -> Tensor:
        """Each class's share of the data as the target says (``class_weights``)."""
        if self.target is None:
            return torch.full((self.num_classes,), 1.0 / self.num_classes, device=self.device)
        return class_weights(self.fmap, self.target, self.cfg)

    def step(self) -> float:
        """One Adam step on the squared distance between G's weighted class means and the target."""
        if self.target is None:
            raise RuntimeError("the generator has no target yet: no client's summary was accepted")
        self.model.train()
        loss = embedding_loss(self.model, self.fmap, self.target, self.cfg, self.rng)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.ema.update(self.model)
        return float(loss.detach())

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.get_state(),
            "target": None if self.target is None else self.target.cpu(),
            "releases": self.releases,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.set_state(state["rng"])
        target = state["target"]
        if target is not None and tuple(target.shape) != self.shape:
            raise ValueError(f"the checkpoint's target has shape {tuple(target.shape)}, this run's is {self.shape}")
        self.target = None if target is None else target.to(self.device)
        self.releases = int(state["releases"])


def class_weights(fmap: SummaryFeatures, target: Tensor, cfg: ExperimentConfig) -> Tensor:
    """Each class's share of the data, read from the target's count coordinate (uniform when the
    summaries carry no counts); clamped to [1e-3, 1] against the noise."""
    if cfg.merf_count_share == 0:
        return torch.full((target.shape[0],), 1.0 / target.shape[0], device=target.device)
    return (target[:, -1] / fmap.count).clamp(1e-3, 1.0)


def embedding_loss(
    model: nn.Module, fmap: SummaryFeatures, target: Tensor, cfg: ExperimentConfig, rng: torch.Generator
) -> Tensor:
    """The squared distance between G's class means of the features (``merf_batch`` samples per
    class, weighted by the target's class shares) and the released ``target``: DP-MERF's generator
    loss, and a seeded GAN's anchor to its seed release (``common/methods/seeding``). With
    ``merf_smoothness`` it adds that weight times ``roughness`` of the samples: a prior on G, not on the
    data, so the fit stays post-processing of the release (the anchor keeps it, as the seed's fit had it)."""
    num_classes, per_class = target.shape[0], cfg.merf_batch
    device = target.device
    y = torch.arange(num_classes).repeat_interleave(per_class).to(device)
    z = sample_latent(len(y), cfg.z_dim, generator=rng).to(device)
    images = model(z, y)
    means = fmap.class_means(images, y, num_classes, total=per_class)
    loss = (means * class_weights(fmap, target, cfg)[:, None] - target).square().sum()
    return loss + cfg.merf_smoothness * roughness(images) if cfg.merf_smoothness else loss


def roughness(images: Tensor) -> Tensor:
    """The mean squared difference between vertically and between horizontally neighbouring pixels of
    ``[n, c, h, w]`` images. Why: the release's noise is isotropic in feature space, and a generator fitting
    it closely does so with pixel-level patterns (salt and pepper at ε 1, measured in
    ``bench/results/frontier-e1-features-fashion-mnist-cpu.md``); penalizing them costs the data's own
    edges little, since neighbouring pixels of a real image mostly agree."""
    dy = images[..., 1:, :] - images[..., :-1, :]
    dx = images[..., :, 1:] - images[..., :, :-1]
    return dy.square().mean() + dx.square().mean()
