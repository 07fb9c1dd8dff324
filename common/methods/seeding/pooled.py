"""The seed release where one curator pools every partition (DPGAN): example-level, on the curator.

A federated seed (``server/seeded.py``) is a client-level release that every client makes through the
run's channel. A method whose data is pooled on one trusted curator (``Method.pools_data``) protects
examples, not clients, and its curator holds every example: its seed is made there, in its own unit,
as DP-MERF's original (centralized) release. The curator sums ``φ(x) ⊗ onehot(y)`` over the pooled
data (each row of norm exactly 1, so adding or removing one example moves the sum by at most 1 in
Frobenius norm) and adds N(0, σ_s²) to every coordinate: one Gaussian mechanism with noise multiplier
σ_s under add/remove, the neighbouring relation of the DP-SGD steps that follow, composed with them in
the curator's one ledger. The release is then normalized by its own noisy count (its count coordinate:
post-processing) into the labelled mean embedding a federated seed's target is, G is fitted to it, and
the run's generator keeps fitting it (``SeedAnchor``). Derived, not measured: the noise on that mean is
σ_s/N per coordinate, where one client's release in the clear carries 2σS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from common.calibration import ledger_epsilon, smallest_noise
from common.options import check
from common.privacy import PrivacyEvent
from common.privacy.events import VOID_NOISE_SEED

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

RULE_POOLED_SEED = (
    "a seed release first (--init-release): the curator's labelled sum of φ(x) ⊗ onehot(y) over the pooled data "
    "(‖φ‖ = 1: sensitivity 1 under adding or removing one example) with Gaussian noise σ_s per coordinate, one "
    "Gaussian mechanism composed before the DP-SGD steps in the same ledger; G's fit to it is post-processing"
)


def pools_data(cfg: ExperimentConfig) -> bool:
    """Whether the run's method pools every partition on a curator (its seed is made there)."""
    from common.methods import method

    return method(cfg.strategy).pools_data


def seed_event(cfg: ExperimentConfig) -> PrivacyEvent:
    """The curator's seed release: one Gaussian, sensitivity 1, std σ_s (``init_noise_multiplier``)."""
    void = VOID_NOISE_SEED if cfg.noise_seed >= 0 else ""
    return PrivacyEvent(noise_multiplier=cfg.init_noise_multiplier, sample_rate=1.0, void=void)


def calibrate(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with σ_s for the seed's share ``init_epsilon`` (example-level, one release)."""
    sigma = smallest_noise(lambda s: ledger_epsilon(s, 1.0, 1, cfg.delta), cfg.init_epsilon)
    return cfg.replace(init_noise_multiplier=sigma)


def check_run(cfg: ExperimentConfig) -> None:
    """The release is normalized by its own noisy count: it needs the count coordinate."""
    check(
        cfg.merf_count_share > 0,
        "merf_count_share",
        cfg.merf_count_share,
        "a seed made on a curator reads the pooled size from its count coordinate (it is not public under "
        "adding or removing an example): must be > 0",
    )


def noisy_sum(
    cfg: ExperimentConfig,
    first: ExperimentConfig,
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    noise: torch.Generator,
    *,
    chunk: int = 4096,
) -> Tensor:
    """The release itself: ``[C, row]``, the labelled feature sum plus N(0, σ_s²) per coordinate
    (``first``: the seed method's configuration, ``seed_config``, which names the features)."""
    from common.methods import method

    fmap = method(cfg.init_release).family.build(first, images.device)
    total = torch.zeros(num_classes, fmap.dim, device=images.device)
    for start in range(0, len(labels), chunk):
        sl = slice(start, start + chunk)
        total += fmap.class_means(images[sl], labels[sl], num_classes, total=1)
    draw = torch.randn(total.shape, generator=noise, device=noise.device).to(total.device)
    return total + cfg.init_noise_multiplier * draw


def as_mean(cfg: ExperimentConfig, release: Tensor) -> Tensor:
    """The released sum as a labelled mean embedding, divided by its own noisy count (the count
    coordinates' total over ``√a``; post-processing), as the anchor and the fit take it."""
    count = float(cfg.merf_count_share) ** 0.5
    pooled = float(release[:, -1].sum()) / count
    return release / max(pooled, 1.0)


def fit_generator(
    cfg: ExperimentConfig, first: ExperimentConfig, generator: nn.Module, target: Tensor, num_classes: int
) -> float:
    """``init_steps`` steps of DP-MERF's own fit (``MerfGenerator``: Adam on its loss, its EMA), started
    from ``generator``'s weights; ``generator`` ends as their EMA (what a federated seed stage releases).
    Returns the last loss. Post-processing."""
    from common.methods import method
    from common.methods.dp_merf.generator import MerfGenerator

    with torch.random.fork_rng(devices=[]):  # its construction reseeds torch: the curator's RNG stays
        fitter = MerfGenerator(first, num_classes, method(cfg.init_release).family)
    fitter.start_from(generator.state_dict())
    fitter.set_mean(target, 1)
    loss = 0.0
    for _ in range(cfg.init_steps):
        loss = fitter.step()
    generator.load_state_dict(fitter.ema.module.state_dict())
    return loss


__all__ = [
    "RULE_POOLED_SEED",
    "as_mean",
    "calibrate",
    "check_run",
    "fit_generator",
    "noisy_sum",
    "pools_data",
    "seed_event",
]
