"""DPImageBench's validation split of a training set: the images its generators never see.

DPImageBench (``data/dataset_loader.py``) cuts the real training split with ``torch.manual_seed(0)``
and ``random_split`` into 55,000 training and 5,000 validation images (MNIST family), trains the
generator on the 55,000 and selects the evaluation's classifiers on the 5,000. The same permutation is
drawn here, so the indices are theirs; ``--protocol-holdout`` removes them from every client's
partition, and ``fedgan evaluate --protocol dpimagebench`` selects on them.
"""

from __future__ import annotations

import numpy as np
import torch

SPLIT_SEED = 0
MNIST_FAMILY_SIZE = 60_000
MNIST_FAMILY_TRAIN = 55_000


def protocol_validation(n: int) -> np.ndarray:
    """Sorted indices of the validation split of an ``n``-image training set: the tail of the
    permutation ``random_split`` draws after ``torch.manual_seed(0)`` (5,000 of 60,000; a set of
    another size keeps the proportion, 1 in 12)."""
    if n < 12:
        raise ValueError(f"a training set of {n} images is too small for a validation split (needs >= 12)")
    keep = MNIST_FAMILY_TRAIN if n == MNIST_FAMILY_SIZE else n - n // 12
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    return np.sort(perm[keep:])
