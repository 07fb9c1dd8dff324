"""DP-NTK's public feature map: the neural tangent features of a random one-hidden-layer network.

For ``f(u) = v · relu(W u) / √m`` with public ``W ~ N(0, 1/d)`` (m x d) and ``v ∈ {±1}^m`` drawn from
the run's seed, the tangent features of an input ``u`` are ``∇_θ f(u)``: ``relu(W u) / √m`` for ``v`` and
``(v ⊙ 1[W u > 0]) u^T / √m`` for ``W`` (Yang, Adamczewski, Sutherland, Li & Park, AISTATS 2023: the
NTK of this network, a kernel their experiments show beats random Fourier features for DP-MERF's
mean-embedding release). Each row is normalised to norm 1 (so a summary's norm is at most 1, the
sensitivity the release assumes), scaled to share ``1 − a`` of it, and the constant ``√a`` appended.

Nothing is materialised per example: a class's mean of the ``W`` part is a matrix product
``Σ_i s_i g_i u_iᵀ``, so a batch costs two m x d products whatever m·d is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from common.methods.dp_merf.features import FeatureFamily
from common.privacy.dct import to_coefficients

from .options import SIDE, row_dim

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

WEIGHT_STREAM = 0x7A11  # the public network's seed is derived from the run's seed and this


class TangentFeatures:
    """``φ(x)`` of ``[n, 1, 28, 28]`` images in [0, 1]: rows of ``m(d+1)+1`` coordinates, norm 1."""

    def __init__(self, cfg: ExperimentConfig, device: torch.device | str = "cpu") -> None:
        self.dct = cfg.ntk_dct
        d = self.dct**2 if self.dct else SIDE * SIDE
        seed = torch.Generator().manual_seed(cfg.seed * 1_000_033 + WEIGHT_STREAM)
        self.weight = (torch.randn(cfg.ntk_width, d, generator=seed) / math.sqrt(d)).to(device)
        self.sign = (torch.randint(0, 2, (cfg.ntk_width,), generator=seed) * 2 - 1).float().to(device)
        self.dim = row_dim(cfg)
        self.scale = math.sqrt(1.0 - cfg.merf_count_share)
        self.count = math.sqrt(cfg.merf_count_share)

    def parts(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(u, relu(Wu), v ⊙ 1[Wu > 0], s)``: the input, the two factors of the tangent features and
        each row's scale ``√(1 − a) / ‖∇f(u)‖`` (the 1/√m of both parts cancels in it)."""
        u = to_coefficients(images, self.dct) if self.dct else images.reshape(images.shape[0], -1)
        h = u @ self.weight.T
        act, gate = torch.relu(h), (h > 0).to(h.dtype) * self.sign
        norm = (act.square().sum(1) + gate.square().sum(1) * u.square().sum(1)).sqrt().clamp_min(1e-12)
        return u, act, gate, self.scale / norm

    def __call__(self, images: Tensor) -> Tensor:
        """Every row in full (``[n, dim]``; tests and small batches: ``class_means`` never builds it)."""
        u, act, gate, s = self.parts(images)
        outer = (gate[:, :, None] * u[:, None, :]).flatten(1)
        const = torch.full((u.shape[0], 1), self.count, device=u.device, dtype=u.dtype)
        return torch.cat([act * s[:, None], outer * s[:, None], const], dim=1)

    def class_means(self, images: Tensor, labels: Tensor, num_classes: int, *, total: int) -> Tensor:
        u, act, gate, s = self.parts(images)
        weights = torch.nn.functional.one_hot(labels, num_classes).to(u.dtype)  # [n, C]
        counts = weights.sum(0)
        weights = weights * s[:, None]
        head = weights.T @ act  # [C, m]
        hidden = torch.stack([(gate * weights[:, c : c + 1]).T @ u for c in range(num_classes)])  # [C, m, d]
        const = (counts * self.count)[:, None]
        return torch.cat([head, hidden.flatten(1), const], dim=1) / total


def _describe(cfg: ExperimentConfig) -> str:
    d = f"its {cfg.ntk_dct}x{cfg.ntk_dct} lowest 2-D DCT coefficients" if cfg.ntk_dct else "its 784 pixels"
    return (
        f"the normalised neural tangent features of a public random one-hidden-layer ReLU network of width "
        f"{cfg.ntk_width} on {d} ({row_dim(cfg):,} coordinates)"
    )


TANGENT = FeatureFamily(
    build=TangentFeatures,
    row_dim=row_dim,
    describe=_describe,
    parameters=lambda cfg: {"ntk_width": cfg.ntk_width, "ntk_dct": cfg.ntk_dct, "row_dim": row_dim(cfg)},
)
