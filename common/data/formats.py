"""Readers for the real on-disk formats: IDX gzip (MNIST, Fashion-MNIST, NIST EMNIST) and TFF's
federated EMNIST HDF5.

Every reader returns images as uint8 ``[N, 28, 28]`` (row-major, upright, ink high and background
0, as in MNIST) and labels as int64 ``[N]`` in ``0..num_classes-1``, so everything downstream sees
one convention whatever the source. Anything wrong with a file (missing, truncated gzip, wrong
magic number, wrong size, labels out of range) raises :class:`DataError` with the path and what to
do, instead of a numpy or zlib traceback deep in a training run.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from common.data.errors import DataError

__all__ = [
    "DataError",
    "EMNIST_SPLITS",
    "IDX_IMAGES_MAGIC",
    "IDX_LABELS_MAGIC",
    "emnist_filenames",
    "femnist_filename",
    "fix_hint",
    "mnist_filenames",
    "read_emnist",
    "read_idx_images",
    "read_idx_labels",
    "read_mnist_like",
    "read_tff_h5",
    "read_tff_h5_writer",
    "tff_pixels_to_uint8",
    "tff_writer_sizes",
]

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
IMAGE_SIDE = 28

# Number of classes of each NIST EMNIST split (Cohen et al. 2017, table II).
EMNIST_SPLITS: dict[str, int] = {
    "byclass": 62,
    "bymerge": 47,
    "balanced": 47,
    "letters": 26,
    "digits": 10,
    "mnist": 10,
}


def fix_hint(dataset: str) -> str:
    """What a user should do about a missing or broken file of ``dataset``."""
    hint = f"run `fedgan data download {dataset}` (or put the official files in that folder)"
    if dataset == "fashion-mnist":
        hint += ", or `apt-get install dataset-fashion-mnist` (files in /usr/share/datasets/fashion-mnist)"
    return hint


# --- IDX ------------------------------------------------------------------------------------------


def _read_gzip(path: Path, hint: str) -> bytes:
    """Whole decompressed content; a truncated or non-gzip file is a DataError, not a zlib error."""
    if not path.is_file():
        raise DataError(f"missing data file {path}: {hint}")
    try:
        with gzip.open(path, "rb") as stream:
            return stream.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"corrupt or truncated gzip file {path} ({err}): delete it and {hint}") from err


def _parse_idx(raw: bytes, path: Path, *, magic: int, ndim: int, hint: str) -> np.ndarray:
    """Check the IDX header (big-endian magic and dims) against the payload size, then view it."""
    header_bytes = 4 + 4 * ndim
    found = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
    if found != magic:
        raise DataError(f"{path} has IDX magic number {found}, expected {magic}: wrong or corrupt file; {hint}")
    if len(raw) < header_bytes:
        raise DataError(f"{path} is too short for an IDX header ({len(raw)} bytes): delete it and {hint}")
    dims = struct.unpack(f">{ndim}I", raw[4:header_bytes])
    expected = header_bytes + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise DataError(
            f"{path} holds {len(raw)} bytes but its header {dims} announces {expected}: "
            f"truncated or corrupt; delete it and {hint}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_bytes).reshape(dims)


def read_idx_images(path: str | Path, *, hint: str = "") -> np.ndarray:
    """uint8 images ``[N, 28, 28]`` of a gzip IDX3 file, as stored (row-major)."""
    path = Path(path)
    hint = hint or "download the official file again"
    images = _parse_idx(_read_gzip(path, hint), path, magic=IDX_IMAGES_MAGIC, ndim=3, hint=hint)
    if images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(f"{path} holds images of shape {images.shape[1:]}, expected 28x28; {hint}")
    return images


def read_idx_labels(path: str | Path, *, hint: str = "") -> np.ndarray:
    """int64 labels ``[N]`` of a gzip IDX1 file, as stored (no remapping)."""
    path = Path(path)
    hint = hint or "download the official file again"
    labels = _parse_idx(_read_gzip(path, hint), path, magic=IDX_LABELS_MAGIC, ndim=1, hint=hint)
    return labels.astype(np.int64)


def _read_idx_pair(images_path: Path, labels_path: Path, hint: str) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx_images(images_path, hint=hint)
    labels = read_idx_labels(labels_path, hint=hint)
    if len(images) != len(labels):
        raise DataError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels: "
            f"the files do not belong together; {hint}"
        )
    return images, labels


def _check_label_range(labels: np.ndarray, num_classes: int, path: Path, hint: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{path} has labels in [{labels.min()}, {labels.max()}], expected 0..{num_classes - 1}: "
            f"wrong file for this data set; {hint}"
        )


def mnist_filenames(split: str) -> tuple[str, str]:
    """(images, labels) file names of MNIST and Fashion-MNIST, which share the layout."""
    prefix = {"train": "train", "test": "t10k"}[_check_split(split)]
    return f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"


def read_mnist_like(folder: str | Path, split: str, *, dataset: str = "mnist") -> tuple[np.ndarray, np.ndarray]:
    """MNIST or Fashion-MNIST images and labels (10 classes) from ``folder``."""
    folder, hint = Path(folder), fix_hint(dataset)
    images_name, labels_name = mnist_filenames(split)
    images, labels = _read_idx_pair(folder / images_name, folder / labels_name, hint)
    _check_label_range(labels, 10, folder / labels_name, hint)
    return images, labels


# --- NIST EMNIST ----------------------------------------------------------------------------------


def emnist_filenames(emnist_split: str, split: str) -> tuple[str, str]:
    """(images, labels) file names of one NIST EMNIST split, as in NIST's ``gzip.zip``."""
    _check_emnist_split(emnist_split)
    part = _check_split(split)
    stem = f"emnist-{emnist_split}-{part}"
    return f"{stem}-images-idx3-ubyte.gz", f"{stem}-labels-idx1-ubyte.gz"


def read_emnist(folder: str | Path, emnist_split: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """EMNIST images made upright and labels made 0-based.

    NIST stores EMNIST images transposed (column-major), so they are transposed back; ``letters``
    labels are 1..26 in the files (0 is unused) and become 0..25.
    """
    folder, hint = Path(folder), fix_hint("emnist")
    images_name, labels_name = emnist_filenames(emnist_split, split)
    images, labels = _read_idx_pair(folder / images_name, folder / labels_name, hint)
    if emnist_split == "letters":
        labels = labels - 1
    _check_label_range(labels, EMNIST_SPLITS[emnist_split], folder / labels_name, hint)
    return np.ascontiguousarray(images.transpose(0, 2, 1)), labels


# --- TFF federated EMNIST (HDF5) ------------------------------------------------------------------


def femnist_filename(only_digits: bool, split: str) -> str:
    """File name inside TFF's ``fed_emnist[_digitsonly].tar.bz2``."""
    stem = "fed_emnist_digitsonly" if only_digits else "fed_emnist"
    return f"{stem}_{_check_split(split)}.h5"


def tff_pixels_to_uint8(pixels: np.ndarray) -> np.ndarray:
    """TFF float pixels (1.0 = white background, dark ink) to MNIST's uint8 (ink 255, background 0)."""
    pixels = np.asarray(pixels, dtype=np.float32)
    return np.rint((1.0 - np.clip(pixels, 0.0, 1.0)) * 255.0).astype(np.uint8)


def _open_h5(path: Path):
    """Open a TFF HDF5 file read-only; h5py is imported here so IDX users do not pay for it."""
    import h5py

    hint = fix_hint("femnist")
    if not path.is_file():
        raise DataError(f"missing data file {path}: {hint}")
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path} is not a readable HDF5 file ({err}): delete it and {hint}") from err
    if "examples" not in handle:
        handle.close()
        raise DataError(f"{path} has no 'examples' group: not a TFF federated EMNIST file; {hint}")
    return handle


def _read_writer_group(group, path: Path, writer_id: str) -> tuple[np.ndarray, np.ndarray]:
    """One writer's ``pixels`` and ``label`` datasets, validated and converted."""
    hint = fix_hint("femnist")
    try:
        pixels, labels = group["pixels"][()], group["label"][()]
    except (KeyError, OSError) as err:
        raise DataError(f"{path}: writer {writer_id!r} lacks readable pixels/label ({err}); {hint}") from err
    if pixels.ndim != 3 or pixels.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE) or len(pixels) != len(labels):
        raise DataError(
            f"{path}: writer {writer_id!r} has pixels {pixels.shape} and labels {labels.shape}, "
            f"expected [n, 28, 28] and [n]; {hint}"
        )
    if pixels.dtype.kind not in "fiu" or labels.dtype.kind not in "fiu":
        raise DataError(f"{path}: writer {writer_id!r} has pixels of {pixels.dtype} / labels of {labels.dtype}; {hint}")
    if pixels.size and not np.isfinite(pixels).all():
        raise DataError(f"{path}: writer {writer_id!r} has NaN or infinite pixels; {hint}")
    if pixels.size and (pixels.min() < -1e-3 or pixels.max() > 1 + 1e-3):
        raise DataError(f"{path}: writer {writer_id!r} has pixels outside [0, 1]; {hint}")
    if labels.size and not (np.isfinite(labels).all() and np.all(np.asarray(labels) == np.round(labels))):
        raise DataError(f"{path}: writer {writer_id!r} has labels that are not integers; {hint}")
    return tff_pixels_to_uint8(pixels), np.asarray(labels, dtype=np.int64).reshape(-1)


def _writers_group(handle, path: Path):
    """The ``examples`` group of a TFF file (a clear error when it is missing or not a group)."""
    examples = handle.get("examples") if hasattr(handle, "get") else None
    if examples is None or not hasattr(examples, "keys"):
        raise DataError(f"{path}: 'examples' must be a group of writers; {fix_hint('femnist')}")
    return examples


def read_tff_h5(path: str | Path, *, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """All writers of a TFF federated EMNIST file.

    Returns (images, labels, writer_index, writer_ids): ``writer_index[i]`` is the ordinal in
    ``writer_ids`` (sorted, as h5py lists groups) of the writer of image ``i``.
    """
    path = Path(path)
    images, labels, index = [], [], []
    with _open_h5(path) as handle:
        examples = _writers_group(handle, path)
        writer_ids = sorted(examples.keys())
        for ordinal, writer_id in enumerate(writer_ids):
            x, y = _read_writer_group(examples[writer_id], path, writer_id)
            images.append(x)
            labels.append(y)
            index.append(np.full(len(y), ordinal, dtype=np.int64))
    if not writer_ids:
        raise DataError(f"{path} holds no writers; {fix_hint('femnist')}")
    all_labels = np.concatenate(labels)
    _check_label_range(all_labels, num_classes, path, fix_hint("femnist"))
    return np.concatenate(images), all_labels, np.concatenate(index), writer_ids


def read_tff_h5_writer(path: str | Path, ordinal: int, *, num_classes: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Only writer number ``ordinal`` (in sorted order): a client loads its own data and no more."""
    path = Path(path)
    with _open_h5(path) as handle:
        examples = _writers_group(handle, path)
        writer_ids = sorted(examples.keys())
        if not 0 <= ordinal < len(writer_ids):
            raise DataError(f"{path} holds {len(writer_ids)} writers; writer #{ordinal} does not exist")
        writer_id = writer_ids[ordinal]
        images, labels = _read_writer_group(examples[writer_id], path, writer_id)
    _check_label_range(labels, num_classes, path, fix_hint("femnist"))
    return images, labels, writer_id


def tff_writer_sizes(path: str | Path) -> tuple[list[str], list[int]]:
    """Writer ids (sorted) and their image counts, read from the dataset shapes without pixels."""
    path = Path(path)
    with _open_h5(path) as handle:
        examples = _writers_group(handle, path)
        writer_ids = sorted(examples.keys())
        try:
            sizes = [int(examples[w]["label"].shape[0]) for w in writer_ids]
        except KeyError as err:
            raise DataError(f"{path}: a writer lacks its 'label' dataset ({err}); {fix_hint('femnist')}") from err
    return writer_ids, sizes


# --- helpers ----------------------------------------------------------------------------------------


def _check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def _check_emnist_split(emnist_split: str) -> None:
    if emnist_split not in EMNIST_SPLITS:
        raise ValueError(f"emnist_split must be one of {sorted(EMNIST_SPLITS)}, got {emnist_split!r}")
