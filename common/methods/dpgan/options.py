"""Centralized DPGAN's section of the configuration (``ExperimentConfig`` composes it) and its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.options import check, check_all, check_choice, option

from .grouping import BOUND_RULES, GROUPINGS, NOISE_FORMS

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

LOSSES = ("ns", "wgan-gp")


@dataclass(frozen=True)
class Options:
    """Centralized DPGAN's section of the configuration."""

    dpgan_noise_multiplier: float = option(1.0, "dpgan: DP-SGD noise multiplier sigma (noise std sigma*C)")
    dpgan_clip: float = option(1.0, "dpgan: per-example clipping bound C of D's gradient")
    dpgan_batch_size: int = option(128, "dpgan: expected real batch B (Poisson sampling with q = B/N)")
    dpgan_n_d: int = option(5, "dpgan: discriminator steps per generator step (initial value when adaptive)")
    dpgan_adaptive: bool = option(False, "dpgan: adapt n_D when D's EMA accuracy on fakes drops below the threshold")
    dpgan_adaptive_threshold: float = option(0.6, "dpgan: threshold d of the adaptive n_D schedule")
    dpgan_loss: str = option("ns", f"dpgan: discriminator loss, one of {', '.join(LOSSES)}")
    dpgan_lr: float = option(2e-4, "dpgan: Adam learning rate of D and G")
    dpgan_clip_groups: str = option(
        "none",
        "dpgan: dpGAN's parameter grouping, clipping each example's gradient group by group: none, weight-bias "
        "(all weights / all biases) or layer (each tensor); the sensitivity is the norm over the groups' bounds, "
        "which always equals dpgan-clip, so sigma and epsilon are those of flat clipping",
    )
    dpgan_group_bounds: str = option(
        "equal",
        "dpgan: the groups' bounds: equal (dpgan-clip/sqrt(groups) each) or public (dpGAN's adaptive bounds: "
        "proportional to each group's median per-example gradient norm on a public batch, rescaled to "
        "dpgan-clip; needs public-data; costs no privacy)",
    )
    dpgan_group_noise: str = option(
        "isotropic",
        "dpgan: the grouped noise, isotropic (sigma * dpgan-clip on every coordinate, Opacus' per-layer form) or "
        "proportional (sigma * sqrt(groups) * C_j on group j: the same mechanism, smaller noise on small groups)",
    )
    dpgan_bounds_every: int = option(10, "dpgan: rounds between re-estimations of public group bounds")


def validate(c: ExperimentConfig) -> None:
    check_choice(c, "dpgan_loss", LOSSES)
    check_choice(c, "dpgan_clip_groups", GROUPINGS)
    check_choice(c, "dpgan_group_bounds", BOUND_RULES)
    check_choice(c, "dpgan_group_noise", NOISE_FORMS)
    check(c.dpgan_bounds_every >= 1, "dpgan_bounds_every", c.dpgan_bounds_every, "must be >= 1")
    check(
        c.dpgan_group_bounds == "equal" or (c.public_data and c.dpgan_clip_groups != "none"),
        "dpgan_group_bounds",
        c.dpgan_group_bounds,
        "public bounds need public-data and a dpgan-clip-groups other than none",
    )
    check_all(c, ("dpgan_batch_size", "dpgan_n_d"), lambda v: v >= 1, "must be >= 1")
    check_all(c, ("dpgan_clip", "dpgan_lr"), lambda v: v > 0, "must be > 0")
    check(
        c.dpgan_noise_multiplier > 0,
        "dpgan_noise_multiplier",
        c.dpgan_noise_multiplier,
        "must be > 0 (Opacus needs noise)",
    )
    check(
        0 < c.dpgan_adaptive_threshold < 1, "dpgan_adaptive_threshold", c.dpgan_adaptive_threshold, "must be in (0, 1)"
    )
