"""What one client holds: its partition of the training data, as tensors, for a given config.

Two cheap paths avoid materialising the federation: with ``synthetic`` + ``writer`` a client
generates only its own writer, and with ``femnist`` + ``writer`` it reads only its own writer's
group from the HDF5 file. Every other combination needs the whole data set to split it; the data
set and the index arrays are cached per process (keyed by the config fields they depend on), so
twenty simulated clients in one process read the files once.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from common.data.dataset import Dataset
from common.data.errors import PartitionError
from common.data.formats import read_tff_h5_writer, tff_writer_sizes
from common.data.holdout import held_out, uses_writer_holdout
from common.data.loading import dataset_num_classes, femnist_path, load_dataset
from common.data.partition import (
    apply_inversion,
    invert_clients,
    partition_by_writer,
    partition_dirichlet,
    partition_iid,
    partition_shards,
)
from common.data.protocol import protocol_validation
from common.data.synthetic import synthetic_writer, synthetic_writer_labels

if TYPE_CHECKING:
    from common.run_options import RunOptions

__all__ = [
    "ClientData",
    "check_partition_sizes",
    "class_balance",
    "clear_cache",
    "client_arrays",
    "client_data_from_arrays",
    "client_labels",
    "load_client_partition",
    "num_classes_for",
    "partition_key",
    "partition_sizes",
]

_CACHE_ENTRIES = 2  # data sets kept per process: a train set and, say, a test set
_cache: OrderedDict[tuple, Any] = OrderedDict()
_cache_lock = threading.RLock()


@dataclass
class ClientData:
    """One client's training data: images float32 ``[n, 1, 28, 28]`` in [0, 1], labels int64 ``[n]``."""

    images: torch.Tensor
    labels: torch.Tensor
    client_id: int
    inverted: bool

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def num_classes_for(cfg: RunOptions) -> int:
    """Number of label classes the generator and discriminators are conditioned on."""
    return dataset_num_classes(cfg.dataset, cfg.emnist_split)


def class_balance(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Fraction of ``labels`` in each class, float64 ``[num_classes]`` (zeros for no labels)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def clear_cache() -> None:
    """Forget cached data sets and partitions (tests, or after files changed on disk)."""
    with _cache_lock:
        _cache.clear()


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    """Memoise ``build()`` under ``key``, keeping the most recent entries (LRU)."""
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        value = build()
        _cache[key] = value
        while len(_cache) > 2 * _CACHE_ENTRIES:  # a data set and its partition per entry
            _cache.popitem(last=False)
        return value


# --- keys and the full-data path ----------------------------------------------------------------


def _synthetic_writers(cfg: RunOptions) -> int:
    return cfg.synthetic_writers or cfg.num_clients


def _dataset_key(cfg: RunOptions) -> tuple:
    """The config fields a loaded training set depends on."""
    if cfg.dataset == "synthetic":
        return ("synthetic", cfg.seed, _synthetic_writers(cfg), cfg.synthetic_samples_per_writer)
    return (cfg.dataset, cfg.data_dir, cfg.emnist_split)


def training_set(cfg: RunOptions) -> Dataset:
    """The whole training set of ``cfg`` (cached), before any slice is held out or split."""
    build = functools.partial(  # deferred, so a cache hit costs nothing
        load_dataset,
        cfg.dataset,
        cfg.data_dir,
        split="train",
        emnist_split=cfg.emnist_split,
        seed=cfg.seed,
        synthetic_writers=_synthetic_writers(cfg),
        synthetic_samples_per_writer=cfg.synthetic_samples_per_writer,
    )
    return _cached(("dataset",) + _dataset_key(cfg), build)


def _split(cfg: RunOptions, dataset: Dataset) -> list[np.ndarray]:
    """The partition named by ``cfg.partition`` of a whole data set, after removing the public
    holdout (``common/data/public.py``) and, with ``protocol_holdout``, DPImageBench's validation
    images (``common/data/protocol.py``): indices into the whole set, none of them removed ones."""
    removed = _removed(cfg, len(dataset))
    if removed is None:
        return _split_all(cfg, dataset)
    keep = np.setdiff1d(np.arange(len(dataset)), removed)
    rest = Dataset(
        images=dataset.images[keep],
        labels=dataset.labels[keep],
        writers=None if dataset.writers is None else dataset.writers[keep],
        num_classes=dataset.num_classes,
    )
    return [keep[index] for index in _split_all(cfg, rest)]


def _removed(cfg: RunOptions, n: int) -> np.ndarray | None:
    """Indices no client holds (None: none removed)."""
    parts = []
    if cfg.public_data == "holdout" and not uses_writer_holdout(cfg):
        parts.append(held_out(cfg, n))
    if cfg.protocol_holdout:
        parts.append(protocol_validation(n))
    return np.unique(np.concatenate(parts)) if parts else None


def _split_all(cfg: RunOptions, dataset: Dataset) -> list[np.ndarray]:
    """The partition named by ``cfg.partition`` of ``dataset``."""
    n, k = len(dataset), cfg.num_clients
    if cfg.partition == "writer":
        if dataset.writers is None:
            raise PartitionError(
                f"partition=writer needs a data set with writer ids (synthetic, femnist); "
                f"{cfg.dataset} has none: use iid, dirichlet or shards"
            )
        return partition_by_writer(dataset.writers, k)
    if cfg.partition == "iid":
        return partition_iid(n, k, seed=cfg.seed)
    if cfg.partition == "shards":
        return partition_shards(n, k, seed=cfg.seed)
    # Every client must fill a batch, so the Dirichlet redraw demands batch_size images each.
    return partition_dirichlet(dataset.labels, k, alpha=cfg.dirichlet_alpha, seed=cfg.seed, min_size=cfg.batch_size)


def _partition_indices(cfg: RunOptions) -> list[np.ndarray]:
    key = ("partition",) + _dataset_key(cfg) + (cfg.partition, cfg.num_clients, cfg.dirichlet_alpha, cfg.seed)
    key += _holdout_key(cfg)
    if cfg.partition == "dirichlet":
        key += (cfg.batch_size,)
    return _cached(key, lambda: _split(cfg, training_set(cfg)))


# --- one client -----------------------------------------------------------------------------------


def _check_client(cfg: RunOptions, client_id: int) -> None:
    if not 0 <= client_id < cfg.num_clients:
        raise ValueError(f"client_id must be in [0, num_clients={cfg.num_clients}), got {client_id}")


def client_arrays(cfg: RunOptions, client_id: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Client ``client_id``'s uint8 images, int64 labels and whether they were inverted."""
    _check_client(cfg, client_id)
    if cfg.dataset == "synthetic" and cfg.partition == "writer":
        images, labels = synthetic_writer(client_id, cfg.synthetic_samples_per_writer, seed=cfg.seed)
    elif cfg.dataset == "femnist" and cfg.partition == "writer":
        path = femnist_path(cfg.data_dir, cfg.emnist_split, "train")
        _check_femnist_writers(cfg, path)
        images, labels, _ = read_tff_h5_writer(path, client_id, num_classes=num_classes_for(cfg))
    else:
        dataset, index = training_set(cfg), _partition_indices(cfg)[client_id]
        images, labels = dataset.images[index], dataset.labels[index]
    inverted = bool(cfg.invert_prob > 0 and invert_clients(cfg.num_clients, cfg.invert_prob, seed=cfg.seed)[client_id])
    return (apply_inversion(images) if inverted else images), labels, inverted


def load_client_partition(cfg: RunOptions, client_id: int) -> ClientData:
    """The training data client ``client_id`` holds under ``cfg``, ready for the discriminator."""
    images, labels, inverted = client_arrays(cfg, client_id)
    return client_data_from_arrays(images, labels, client_id=client_id, inverted=inverted)


def client_data_from_arrays(
    images: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, *, client_id: int, inverted: bool
) -> ClientData:
    """uint8 ``[n, 28, 28]`` images and int64 labels as the float tensors the discriminator trains on.

    Separate from ``load_client_partition`` so that a client's stored copy of its partition (see
    ``client/state.py``) is converted exactly as a freshly rendered or read one.
    """
    pixels = torch.as_tensor(np.ascontiguousarray(images), dtype=torch.uint8)
    return ClientData(
        images=pixels.to(torch.float32).div_(255.0).unsqueeze(1),
        labels=torch.as_tensor(np.asarray(labels, dtype=np.int64)),
        client_id=client_id,
        inverted=inverted,
    )


def partition_key(cfg: RunOptions) -> str:
    """The config fields one client's partition depends on, as a string (equal keys, equal data).

    A client may keep a copy of its partition beside its state; the key tells whether that copy
    is still what ``client_arrays`` would give under ``cfg``.
    """
    fields = (_dataset_key(cfg), cfg.partition, cfg.num_clients, cfg.seed, cfg.invert_prob, *_holdout_key(cfg))
    if cfg.partition == "dirichlet":
        fields += (cfg.dirichlet_alpha, cfg.batch_size)
    return repr(fields)


def _holdout_key(cfg: RunOptions) -> tuple:
    """What a partition depends on of the public holdout (nothing unless examples are removed)."""
    key: tuple = ()
    if cfg.public_data == "holdout" and not uses_writer_holdout(cfg):
        key += ("holdout", cfg.public_size)
    if cfg.protocol_holdout:
        key += ("protocol-validation",)
    return key


def client_labels(cfg: RunOptions, client_id: int) -> np.ndarray:
    """Client ``client_id``'s labels, without rendering or converting images where avoidable."""
    _check_client(cfg, client_id)
    if cfg.dataset == "synthetic" and cfg.partition == "writer":
        return synthetic_writer_labels(client_id, cfg.synthetic_samples_per_writer, seed=cfg.seed)
    return client_arrays(cfg, client_id)[1]


# --- sizes ------------------------------------------------------------------------------------------


def _check_femnist_writers(cfg: RunOptions, path) -> list[int]:
    writer_ids, sizes = _cached(("femnist-sizes", str(path)), lambda: tff_writer_sizes(path))
    if len(writer_ids) < cfg.num_clients:
        raise PartitionError(f"num_clients={cfg.num_clients} is more than the {len(writer_ids)} writers in {path}")
    return sizes[: cfg.num_clients]


def partition_sizes(cfg: RunOptions) -> list[int]:
    """Images per client, computed without loading pixels where possible."""
    if cfg.dataset == "synthetic" and cfg.partition == "writer":
        return [cfg.synthetic_samples_per_writer] * cfg.num_clients
    if cfg.dataset == "femnist" and cfg.partition == "writer":
        return _check_femnist_writers(cfg, femnist_path(cfg.data_dir, cfg.emnist_split, "train"))
    return [len(index) for index in _partition_indices(cfg)]


def check_partition_sizes(cfg: RunOptions, *, need: int) -> list[int]:
    """``partition_sizes``, failing early when a client holds fewer than ``need`` images: one batch of
    ``batch_size`` for most methods, one image for a method whose clients draw no batches (the
    method says, ``Method.min_client_images``)."""
    sizes = partition_sizes(cfg)
    small = [(k, s) for k, s in enumerate(sizes) if s < need]
    if small:
        listed = ", ".join(f"client {k}: {s}" for k, s in small[:5]) + (" ..." if len(small) > 5 else "")
        what = (
            f"fewer images than batch_size={cfg.batch_size}" if need == cfg.batch_size else f"fewer than {need} image"
        )
        raise PartitionError(
            f"{len(small)} client partition(s) hold {what} ({listed}): "
            + ("lower batch_size, or " if need == cfg.batch_size else "")
            + "use fewer clients or another partition"
        )
    return sizes
