"""Which examples are declared public before any client's partition is cut (``public.py`` says why):
the held-out slice's indices and whether the holdout is whole writers. Kept apart from ``public.py``,
which reads the training set (``clients.py``), because the partition needs them first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from common.data.errors import PartitionError

if TYPE_CHECKING:
    from common.run_options import RunOptions

PUBLIC_SOURCES = ("", "synthetic", "holdout")
PUBLIC_SEED_OFFSET = 7_777_777  # the public synthetic writers' seed: cfg.seed + this
SYNTHETIC_PER_WRITER = 120
_HOLDOUT_STREAM = 0x9B11C


def held_out(cfg: RunOptions, n: int) -> np.ndarray:
    """Sorted indices of the public slice of an ``n``-example training set (``holdout``, no writers)."""
    if cfg.public_size >= n:
        raise PartitionError(f"public_size={cfg.public_size} would hold out the whole training set of {n} examples")
    rng = np.random.default_rng([cfg.seed, _HOLDOUT_STREAM])
    return np.sort(rng.permutation(n)[: cfg.public_size])


def uses_writer_holdout(cfg: RunOptions) -> bool:
    """Whether the holdout is whole writers outside the federation (the per-writer data paths)."""
    return cfg.partition == "writer" and cfg.dataset in ("synthetic", "femnist")
