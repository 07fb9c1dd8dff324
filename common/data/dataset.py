"""The in-memory data set record shared by the readers, the synthetic generator and the loaders."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Dataset:
    """Images, labels and (when the source has them) writer ids, in one convention for all sources.

    ``images`` is uint8 ``[N, 28, 28]`` with ink high and background 0 (MNIST's convention);
    ``labels`` is int64 ``[N]`` in ``0..num_classes-1``; ``writers`` is int64 ``[N]`` holding the
    writer ordinal of each image (0..W-1), or None for sources without writers (MNIST, NIST EMNIST).
    """

    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    writers: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 3 or self.images.shape[1:] != (28, 28):
            raise ValueError(f"images must be uint8 [N, 28, 28], got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (len(self.images),):
            raise ValueError(f"labels must have shape ({len(self.images)},), got {self.labels.shape}")
        if self.writers is not None and self.writers.shape != self.labels.shape:
            raise ValueError(f"writers must have shape {self.labels.shape}, got {self.writers.shape}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_writers(self) -> int:
        """Distinct writers (0 when the source has none)."""
        return 0 if self.writers is None else int(len(np.unique(self.writers)))
