"""Partitioners: which images each client holds.

All return one sorted int64 index array per client; the arrays are disjoint, and each is a pure
function of its arguments (seeded with ``numpy.random.default_rng``), so every client process
computes the same split independently without talking to the others.
"""

from __future__ import annotations

import numpy as np

from common.data.errors import PartitionError

__all__ = [
    "apply_inversion",
    "invert_clients",
    "partition_by_writer",
    "partition_dirichlet",
    "partition_iid",
    "partition_shards",
]

# Distinct stream tag so the inversion draw does not correlate with the partition draw of the same seed.
_INVERT_STREAM = 0x1A7E


def _check_clients(num_clients: int, available: int, what: str) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if available < num_clients:
        raise PartitionError(f"num_clients={num_clients} is more than the {available} {what} available")


def partition_by_writer(writers: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Client k holds every image of the k-th writer (in sorted writer order): the natural federated split.

    Writers beyond ``num_clients`` are left out, as in FEMNIST experiments that use a subset.
    """
    writers = np.asarray(writers)
    ids, inverse = np.unique(writers, return_inverse=True)
    _check_clients(num_clients, len(ids), "writers")
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(num_clients + 1))
    return [order[bounds[k] : bounds[k + 1]].astype(np.int64) for k in range(num_clients)]


def partition_iid(n: int, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """A uniformly random split into near-equal parts (sizes differ by at most one)."""
    _check_clients(num_clients, n, "images")
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, num_clients)]


def _dirichlet_draw(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """One draw: each class is split across clients by its own Dirichlet(alpha) proportions."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha)))[:-1] * len(idx)).astype(np.int64)
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label skew: per class, Dirichlet(alpha) shares across clients (Hsu et al. 2019).

    Small alpha gives clients few classes each; large alpha approaches iid. The whole split is
    redrawn until every client holds at least ``min_size`` images (as in the common reference code),
    so no client is left without a batch to train on.
    """
    labels = np.asarray(labels)
    _check_clients(num_clients, len(labels) // max(min_size, 1), f"groups of min_size={min_size} images")
    if alpha <= 0:
        raise PartitionError(f"dirichlet alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        parts = _dirichlet_draw(labels, num_clients, alpha, rng)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) split of {len(labels)} images over {num_clients} clients gave every "
        f"client >= {min_size} images in {max_tries} draws: raise alpha, or lower num_clients or the minimum "
        f"(batch_size)"
    )


def partition_shards(n: int, num_clients: int, *, seed: int, shard_size: int | None = None) -> list[np.ndarray]:
    """K equal disjoint random shards (GS-WGAN: 1000 discriminators x 60 MNIST images).

    ``shard_size`` defaults to ``n // num_clients``; images beyond ``num_clients * shard_size`` are dropped.
    """
    _check_clients(num_clients, n, "images")
    size = n // num_clients if shard_size is None else shard_size
    if size < 1 or size * num_clients > n:
        raise PartitionError(f"{num_clients} shards of {size} images need {size * num_clients} images, have {n}")
    perm = np.random.default_rng(seed).permutation(n)[: size * num_clients]
    return [np.sort(shard).astype(np.int64) for shard in perm.reshape(num_clients, size)]


def invert_clients(num_clients: int, p: float, *, seed: int) -> np.ndarray:
    """Which clients have all their images inverted (Augenstein et al. 2020's debugging task).

    Each client independently with probability ``p``; a pure function of the seed so the server
    (which must not see data) and every client agree without communicating.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"inversion probability must be in [0, 1], got {p}")
    return np.random.default_rng([seed, _INVERT_STREAM]).random(num_clients) < p


def apply_inversion(images: np.ndarray) -> np.ndarray:
    """Pixel-intensity inversion of uint8 images: ink becomes background and vice versa."""
    if images.dtype != np.uint8:
        raise ValueError(f"apply_inversion expects uint8 images, got {images.dtype}")
    return 255 - images
