"""DP-NTK's section of the configuration (``ExperimentConfig`` composes it) and its own checks.

Everything of the release but the feature map is the one-shot release's (``common/methods/dp_merf/``)
and so are its options: ``--merf-clip``, ``--merf-noise-multiplier``, ``--merf-count-share``,
``--merf-batch``, ``--merf-lr`` apply to dp-ntk runs unchanged (one flag per mechanism, not one per
method)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.options import check, option

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

SIDE = 28
MAX_COORDINATES = 20_000_000  # a summary's coordinates (classes x row): 80 MB of float32 per client


@dataclass(frozen=True)
class Options:
    """DP-NTK's section of the configuration."""

    ntk_width: int = option(
        200,
        "dp-ntk: width m of the public random one-hidden-layer ReLU network whose tangent features "
        "(its gradient at initialisation) are the kernel's features; a class's row has m*(d+1)+1 coordinates",
    )
    ntk_dct: int = option(
        0,
        "dp-ntk: k > 0: the network sees each image's k x k lowest 2-D DCT coefficients (d = k*k); 0: all "
        "28 x 28 pixels (d = 784)",
    )


def row_dim(c: ExperimentConfig) -> int:
    """Coordinates of one class's row: the gradient of the output layer (m), of the hidden layer
    (m·d), and the constant count coordinate."""
    d = c.ntk_dct**2 if c.ntk_dct else SIDE * SIDE
    return c.ntk_width * (d + 1) + 1


def validate(c: ExperimentConfig) -> None:
    """The section's own checks (``ExperimentConfig`` runs them with every other section's)."""
    check(c.ntk_width >= 1, "ntk_width", c.ntk_width, "must be >= 1")
    check(0 <= c.ntk_dct <= SIDE, "ntk_dct", c.ntk_dct, f"must be in [0, {SIDE}] (0: pixels)")
    check(
        row_dim(c) * 10 <= MAX_COORDINATES,
        "ntk_width",
        c.ntk_width,
        f"a summary of {row_dim(c):,} coordinates per class is over the {MAX_COORDINATES:,} a release may hold "
        "for ten classes; lower ntk_width or set ntk_dct",
    )
