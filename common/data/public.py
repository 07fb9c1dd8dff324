"""Public data: examples declared public, which any party may use without privacy cost.

dpGAN (Zhang et al. 2018) warm-starts G and D on public data before private training and
estimates its clipping bounds on it. A run names its public data with ``--public-data``:

- ``synthetic``: the embedded synthetic handwriting, rendered from its own seed
  (``PUBLIC_SEED_OFFSET``), so it shares no writer with a private synthetic federation. Public for
  real digits; for other data sets (Fashion-MNIST, letters) it is out of domain and only teaches
  strokes, and its labels are the digits 0-9 whatever the private classes mean.
- ``holdout``: a slice of the training data held apart and declared public. With a writer partition
  it is whole writers outside the federation (ids ``num_clients``, ``num_clients + 1``, ...: no
  client holds them); otherwise ``public_size`` examples drawn by a seeded permutation and removed
  from every client's partition before the split (``held_out``), so no private example is public.

Declaring data public is the user's claim, not something fedgan can check; the privacy statement
names what was declared public.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from common.data.clients import training_set
from common.data.errors import PartitionError
from common.data.formats import read_tff_h5_writer, tff_writer_sizes
from common.data.holdout import PUBLIC_SEED_OFFSET, PUBLIC_SOURCES, SYNTHETIC_PER_WRITER, held_out, uses_writer_holdout
from common.data.loading import dataset_num_classes, femnist_path
from common.data.synthetic import MAX_WRITERS, synthetic_writer

__all__ = ["PUBLIC_SEED_OFFSET", "PUBLIC_SOURCES", "held_out", "public_arrays", "uses_writer_holdout"]

if TYPE_CHECKING:
    from common.run_options import RunOptions


def public_arrays(cfg: RunOptions) -> tuple[np.ndarray, np.ndarray]:
    """The public examples of ``cfg``: uint8 ``[n, 28, 28]`` images and int64 labels (empty: none)."""
    if cfg.public_data == "synthetic":
        return _writers(cfg, lambda w: synthetic_writer(w, SYNTHETIC_PER_WRITER, seed=cfg.seed + PUBLIC_SEED_OFFSET))
    if cfg.public_data != "holdout":
        return np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int64)
    if uses_writer_holdout(cfg):
        return _writer_holdout(cfg)
    dataset = training_set(cfg)
    index = held_out(cfg, len(dataset))
    return dataset.images[index], dataset.labels[index]


def _writer_holdout(cfg: RunOptions) -> tuple[np.ndarray, np.ndarray]:
    """Whole writers after the federation's: ids num_clients, num_clients + 1, ... until public_size."""
    if cfg.dataset == "synthetic":
        per = cfg.synthetic_samples_per_writer
        last = cfg.num_clients + math.ceil(cfg.public_size / per)
        if last > MAX_WRITERS:
            raise PartitionError(
                f"public_size={cfg.public_size} needs synthetic writers up to id {last - 1} (max {MAX_WRITERS - 1})"
            )
        return _writers(cfg, lambda w: synthetic_writer(cfg.num_clients + w, per, seed=cfg.seed))
    path = femnist_path(cfg.data_dir, cfg.emnist_split, "train")
    ids, _ = tff_writer_sizes(path)
    if len(ids) <= cfg.num_clients:
        raise PartitionError(f"{path} has {len(ids)} writers: none is left outside num_clients={cfg.num_clients}")

    def read(w: int) -> tuple[np.ndarray, np.ndarray]:
        if cfg.num_clients + w >= len(ids):
            raise PartitionError(f"{path} runs out of writers before public_size={cfg.public_size} examples")
        images, labels, _ = read_tff_h5_writer(
            path, cfg.num_clients + w, num_classes=dataset_num_classes(cfg.dataset, cfg.emnist_split)
        )
        return images, labels

    return _writers(cfg, read)


def _writers(cfg: RunOptions, writer) -> tuple[np.ndarray, np.ndarray]:
    """Writers 0, 1, ... of ``writer`` until ``public_size`` examples, cut to exactly that many."""
    images, labels, n, w = [], [], 0, 0
    while n < cfg.public_size:
        x, y = writer(w)
        images.append(x)
        labels.append(y)
        n, w = n + len(y), w + 1
    return np.concatenate(images)[: cfg.public_size], np.concatenate(labels)[: cfg.public_size].astype(np.int64)
