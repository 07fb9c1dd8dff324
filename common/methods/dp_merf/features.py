"""DP-MERF's public feature map ``φ``, the seam a one-shot method supplies its own through
(``FeatureFamily``), and a client's summary: its labelled mean embedding."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from common.privacy.dct import to_coefficients

from .options import SIDE

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

FREQUENCY_STREAM = 0x3E5F  # the public frequencies' seed is derived from the run's seed and this


class SummaryFeatures(Protocol):
    """A public feature map as the one-shot release needs it: rows of norm exactly 1 (so a summary's
    Frobenius norm is at most 1 whatever the client holds), the last coordinate the constant ``count``."""

    dim: int  # coordinates of one class's row
    count: float  # the constant last coordinate (its class mean is ``count`` times the class's share)

    def class_means(self, images: Tensor, labels: Tensor, num_classes: int, *, total: int) -> Tensor:
        """``[C, dim]``: row c is ``Σ_{i: y_i = c} φ(x_i) / total``."""
        ...


@dataclass(frozen=True)
class FeatureFamily:
    """How a one-shot method names its feature map: DP-MERF's random Fourier features here, another
    method's own (``common/methods/dp_ntk/``). Everything else of the release — clipping, noise,
    secure sums, the generator fitted on the server — is this folder's, shared."""

    build: Callable[[ExperimentConfig, torch.device | str], SummaryFeatures]
    row_dim: Callable[[ExperimentConfig], int]  # ``dim`` without building the map
    describe: Callable[[ExperimentConfig], str]  # φ in the privacy statement's words
    parameters: Callable[[ExperimentConfig], dict[str, Any]]  # the report's and summary's figures


class FeatureMap:
    """``φ``: images ``[n, 1, 28, 28]`` in [0, 1] -> ``[n, 2D+1]`` rows of norm exactly 1.

    Random Fourier features of the Gaussian kernel ``exp(-‖u − u'‖² / 2ℓ²)`` on ``u`` (the pixels or
    their k×k lowest DCT coefficients), scaled to share ``1 − a`` of the squared norm, and one
    constant coordinate ``√a``: averaged per class, it is ``√a`` times the class's share of the data.
    Everything here is public: the frequencies come from the run's seed, on the CPU, so the server and
    every client build the same map without sending it.
    """

    def __init__(self, cfg: ExperimentConfig, device: torch.device | str = "cpu") -> None:
        self.dct = cfg.merf_dct
        self.features = cfg.merf_features
        dims = self.dct**2 if self.dct else SIDE * SIDE
        seed = torch.Generator().manual_seed(cfg.seed * 1_000_033 + FREQUENCY_STREAM)
        self.frequencies = (torch.randn(dims, self.features, generator=seed) / cfg.merf_lengthscale).to(device)
        self.scale = math.sqrt((1.0 - cfg.merf_count_share) / self.features)
        self.count = math.sqrt(cfg.merf_count_share)

    @property
    def dim(self) -> int:
        return 2 * self.features + 1

    def class_means(self, images: Tensor, labels: Tensor, num_classes: int, *, total: int) -> Tensor:
        return class_means(self(images), labels, num_classes, total=total)

    def __call__(self, images: Tensor) -> Tensor:
        flat = to_coefficients(images, self.dct) if self.dct else images.reshape(images.shape[0], -1)
        phase = flat @ self.frequencies
        const = torch.full((images.shape[0], 1), self.count, device=images.device, dtype=phase.dtype)
        return torch.cat([phase.cos() * self.scale, phase.sin() * self.scale, const], dim=1)


def class_means(phi: Tensor, labels: Tensor, num_classes: int, *, total: int | None = None) -> Tensor:
    """``[C, dim]``: row c is ``Σ_{i: y_i = c} φ_i / total`` (``total`` defaults to n). With
    ``total = n`` this is the labelled mean embedding, of Frobenius norm at most 1."""
    out = torch.zeros(num_classes, phi.shape[1], device=phi.device, dtype=phi.dtype)
    return out.index_add_(0, labels, phi) / (total or phi.shape[0])


def embed(fmap: SummaryFeatures, images: Tensor, labels: Tensor, num_classes: int, *, chunk: int = 4096) -> Tensor:
    """The client's summary: its labelled mean embedding ``[C, 2D+1]`` (norm ≤ 1), in chunks of
    ``chunk`` images so a large client never holds all its features at once."""
    if images.shape[0] == 0 or images.shape[0] != labels.shape[0]:
        raise ValueError("images and labels must be non-empty and equally long")
    total = torch.zeros(num_classes, fmap.dim, device=images.device)
    for start in range(0, images.shape[0], chunk):
        sl = slice(start, start + chunk)
        total += fmap.class_means(images[sl], labels[sl], num_classes, total=images.shape[0])
    return total


def _describe(cfg: ExperimentConfig) -> str:
    k = cfg.merf_dct
    space = f"its {k}x{k} lowest 2-D DCT coefficients (a fixed public basis)" if k else "its pixels"
    return f"{cfg.merf_features} public random Fourier frequencies of a Gaussian kernel on {space}"


RANDOM_FOURIER = FeatureFamily(
    build=FeatureMap,
    row_dim=lambda cfg: 2 * cfg.merf_features + 1,
    describe=_describe,
    parameters=lambda cfg: {"features": cfg.merf_features, "dct": cfg.merf_dct},
)
