"""Frechet distance between feature statistics, and a cache for the reference statistics.

The distance is pytorch-fid's ``calculate_frechet_distance`` (Heusel et al. 2017, the numerically
stable form by D. J. Sutherland), so numbers are comparable with pytorch-fid's. Statistics carry
their sample count ``n`` because FID is biased upwards for small ``n`` and must be reported with it.

Reference statistics (of the real data) are computed once and kept in a ``.npz`` next to the run;
a damaged cache is recomputed with a warning, never trusted and never fatal.
"""

from __future__ import annotations

import functools
import inspect
import os
import tempfile
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FeatureStats", "cached_stats", "feature_stats", "frechet_distance"]

_STATS_FORMAT = 1


@dataclass(frozen=True)
class FeatureStats:
    """Mean ``[D]`` and covariance ``[D, D]`` of ``n`` feature vectors (float64)."""

    mu: np.ndarray
    sigma: np.ndarray
    n: int

    def __post_init__(self) -> None:
        mu, sigma = np.asarray(self.mu, np.float64), np.asarray(self.sigma, np.float64)
        if mu.ndim != 1 or sigma.shape != (mu.size, mu.size):
            raise ValueError(f"need mu [D] and sigma [D, D], got {mu.shape} and {sigma.shape}")
        if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
            raise ValueError("feature statistics are not finite")
        if int(self.n) < 2:
            raise ValueError(f"statistics need n >= 2 samples, got {self.n}")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "n", int(self.n))

    def save(self, path: str | Path) -> None:
        """Write atomically: a reader sees the old file or the complete new one, never a torn one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, format=_STATS_FORMAT, mu=self.mu, sigma=self.sigma, n=self.n)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> FeatureStats:
        """Read a file written by :meth:`save`; any damage is a ``ValueError`` naming the file."""
        try:
            with np.load(path, allow_pickle=False) as data:
                if int(data["format"]) != _STATS_FORMAT:
                    raise ValueError(f"format {int(data['format'])}, expected {_STATS_FORMAT}")
                return cls(mu=data["mu"], sigma=data["sigma"], n=int(data["n"]))
        except FileNotFoundError:
            raise
        except Exception as err:  # BadZipFile, EOFError, KeyError, pickled content, bad shapes
            raise ValueError(f"unreadable feature statistics in {path}: {err!r}") from err


def feature_stats(features: np.ndarray) -> FeatureStats:
    """Mean and covariance of ``[N, D]`` features, as pytorch-fid computes them."""
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2 or len(features) < 2:
        raise ValueError(f"need features [N >= 2, D], got shape {features.shape}")
    return FeatureStats(mu=features.mean(axis=0), sigma=np.cov(features, rowvar=False), n=len(features))


def frechet_distance(a: FeatureStats, b: FeatureStats) -> float:
    """FID between two Gaussians: ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2))``."""
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"feature dimensions differ: {a.mu.shape} vs {b.mu.shape}")
    with warnings.catch_warnings():
        # pytorch-fid 0.3 passes sqrtm(disp=False), deprecated by SciPy 1.17 (scipy is pinned < 1.18);
        # with fewer samples than feature dimensions both covariances are singular by construction,
        # which pytorch-fid's formula handles: neither warning tells the user anything.
        warnings.filterwarnings("ignore", message="The `disp` argument is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="Matrix is singular", category=linalg_warning())
        return float(_calculate_frechet_distance()(a.mu, a.sigma, b.mu, b.sigma))


def linalg_warning() -> type[Warning]:
    from scipy.linalg import LinAlgWarning

    return LinAlgWarning


@functools.cache
def _calculate_frechet_distance() -> Callable[..., float]:
    """pytorch-fid's own function (its import needs torchvision: see ``torchvision_compat``)."""
    from .torchvision_compat import ensure_torchvision

    ensure_torchvision()
    import pytorch_fid.fid_score as fid_score
    from scipy import linalg

    if "disp" not in inspect.signature(linalg.sqrtm).parameters:  # SciPy >= 1.18 (a lent GPU's image)
        fid_score.linalg = types.SimpleNamespace(sqrtm=sqrtm_with_disp(linalg.sqrtm))
    return fid_score.calculate_frechet_distance


def sqrtm_with_disp(sqrtm: Callable[[np.ndarray], np.ndarray]) -> Callable[..., Any]:
    """``sqrtm`` with the ``disp`` argument pytorch-fid 0.3 passes (``disp=False``: the root and its
    error estimate), for a SciPy that removed it (1.18): this project pins scipy < 1.18, but a lent
    GPU's image has its own SciPy, and every evaluation there failed on the keyword."""

    def wrapped(a: np.ndarray, disp: bool = True) -> Any:
        root = sqrtm(a)
        if disp:
            return root
        err = np.linalg.norm(root @ root - a, "fro") ** 2 / max(np.linalg.norm(a, "fro"), np.finfo(float).tiny)
        return root, err

    return wrapped


def cached_stats(cache_path: str | Path, compute: Callable[[], np.ndarray]) -> FeatureStats:
    """Statistics stored at ``cache_path``, or of ``compute()``'s ``[N, D]`` features, then stored.

    The caller puts everything the features depend on (extractor ``name``, data set, split, ``n``)
    into ``cache_path``; this function only guarantees compute-once and recovery from damage.
    """
    cache_path = Path(cache_path)
    if cache_path.exists():
        try:
            return FeatureStats.load(cache_path)
        except (ValueError, OSError) as err:
            warnings.warn(f"recomputing feature statistics: {err}", RuntimeWarning, stacklevel=2)
    stats = feature_stats(compute())
    stats.save(cache_path)
    return stats
