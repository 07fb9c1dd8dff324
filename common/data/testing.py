"""Writers of the real on-disk formats, for tests and offline demos.

The real data sets cannot be downloaded everywhere, so tests (ours and the integration tests)
write tiny files in exactly the official layouts and read them back through the real readers.
Writers are the exact inverses of the readers: EMNIST images are stored transposed, TFF pixels
as float ``1 - ink``.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from common.data.formats import (
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    emnist_filenames,
    femnist_filename,
    mnist_filenames,
)

__all__ = ["femnist_file", "idx_bytes", "write_emnist", "write_idx", "write_mnist_like", "write_tff_h5"]


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """Uncompressed IDX content: big-endian magic, big-endian dims, then the uint8 payload."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.tobytes()


def write_idx(path: str | Path, array: np.ndarray, magic: int) -> Path:
    """A gzip IDX file (images: magic 2051 and [N, 28, 28]; labels: magic 2049 and [N])."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(idx_bytes(array, magic)))
    return path


def write_mnist_like(folder: str | Path, images: np.ndarray, labels: np.ndarray, split: str = "train") -> list[Path]:
    """The two files of one MNIST / Fashion-MNIST split."""
    images_name, labels_name = mnist_filenames(split)
    return [
        write_idx(Path(folder) / images_name, images, IDX_IMAGES_MAGIC),
        write_idx(Path(folder) / labels_name, labels, IDX_LABELS_MAGIC),
    ]


def write_emnist(
    folder: str | Path, emnist_split: str, images: np.ndarray, labels: np.ndarray, split: str = "train"
) -> list[Path]:
    """NIST EMNIST files: upright ``images`` are stored transposed; ``labels`` as given (1-based: letters)."""
    images_name, labels_name = emnist_filenames(emnist_split, split)
    return [
        write_idx(Path(folder) / images_name, np.asarray(images).transpose(0, 2, 1), IDX_IMAGES_MAGIC),
        write_idx(Path(folder) / labels_name, labels, IDX_LABELS_MAGIC),
    ]


def write_tff_h5(path: str | Path, writers: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    """A TFF federated EMNIST file: ``examples/<writer>/pixels`` (float32, 1 - ink) and ``label`` (int32)."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        examples = handle.create_group("examples")
        for writer_id, (images, labels) in writers.items():
            group = examples.create_group(writer_id)
            group.create_dataset("pixels", data=1.0 - np.asarray(images, dtype=np.float32) / 255.0)
            group.create_dataset("label", data=np.asarray(labels, dtype=np.int32))
    return path


def femnist_file(folder: str | Path, only_digits: bool, split: str = "train") -> Path:
    """Where a TFF file of this variant and split belongs in a FEMNIST folder."""
    return Path(folder) / femnist_filename(only_digits, split)
