"""DP-MERF's section of the configuration (``ExperimentConfig`` composes it) and its own checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.options import check, check_all, option

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

SIDE = 28


@dataclass(frozen=True)
class Options:
    """DP-MERF's section of the configuration."""

    merf_features: int = option(
        200,
        "dp-merf: random Fourier frequencies D of the kernel's features (each class's summary has 2D+1 "
        "coordinates); fewer features carry less noise in all but approximate the kernel more coarsely",
    )
    merf_lengthscale: float = option(
        8.0,
        "dp-merf: length scale of the Gaussian kernel on the kernel's input (pixels in [0, 1] or their DCT "
        "coefficients); a public constant, never estimated from the clients' data (that would leak)",
    )
    merf_dct: int = option(
        10,
        "dp-merf: k > 0: the kernel sees each image's k x k lowest 2-D DCT frequencies (a fixed public basis), "
        "so the summary spends its budget on shapes rather than pixel detail; 0: all 28 x 28 pixels",
    )
    merf_count_share: float = option(
        0.1,
        "dp-merf: share of each summary's squared norm spent on the class counts, from which the server "
        "estimates the class proportions (0: assume them uniform)",
    )
    merf_clip: float = option(
        1.0,
        "dp-merf: L2 bound S each client's summary is clipped to before the noise (sensitivity 2S, noise std "
        "2*sigma*S); a summary's norm is at most 1, and at most 1/sqrt(C) for a client whose data is spread "
        "evenly over C classes, so S = 1/sqrt(C) clips nothing of a balanced client and cuts the noise "
        "sqrt(C)-fold, while a client holding few classes is scaled down; 1: nothing is ever clipped",
    )
    merf_noise_multiplier: float = option(
        1.0, "dp-merf: sigma of each client's single release: noise std 2*sigma*S per coordinate (sensitivity 2S)"
    )
    merf_batch: int = option(16, "dp-merf: generated samples per class in each generator step")
    merf_lr: float = option(1e-3, "dp-merf: the generator's Adam learning rate (betas 0.9, 0.999)")
    merf_smoothness: float = option(
        0.0,
        "dp-merf: weight of a smoothness penalty on G's samples while it fits the release (the mean squared "
        "difference of neighbouring pixels); post-processing, so it costs no privacy. At small epsilon the "
        "release's noise is as large as its signal and G otherwise draws it as salt-and-pepper pixels",
    )


def validate(c: ExperimentConfig) -> None:
    """The section's own checks (``ExperimentConfig`` runs them with every other section's)."""
    check_all(c, ("merf_features", "merf_batch"), lambda v: v >= 1, "must be >= 1")
    check_all(c, ("merf_lengthscale", "merf_lr"), lambda v: v > 0, "must be > 0")
    check(0 < c.merf_clip <= 1, "merf_clip", c.merf_clip, "must be in (0, 1] (a summary's norm is at most 1)")
    check(0 <= c.merf_dct <= SIDE, "merf_dct", c.merf_dct, f"must be in [0, {SIDE}] (0: pixels)")
    check(0 <= c.merf_count_share < 1, "merf_count_share", c.merf_count_share, "must be in [0, 1)")
    check(c.merf_noise_multiplier >= 0, "merf_noise_multiplier", c.merf_noise_multiplier, "must be >= 0")
    check(c.merf_smoothness >= 0, "merf_smoothness", c.merf_smoothness, "must be >= 0 (0: no penalty)")
