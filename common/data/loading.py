"""Where data sets live on disk and how a whole data set is loaded by name.

Layout: a data *root* (``--data-dir``, else ``$FEDGAN_DATA``, else ``./data``) holds one folder per
data set (``mnist/``, ``fashion-mnist/``, ``emnist/``, ``femnist/``), which is where
``fedgan data download`` writes. An explicit ``--data-dir`` may also point straight at a folder
holding the files, and Fashion-MNIST is also found where Debian's ``dataset-fashion-mnist``
package installs the real files.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.data.dataset import Dataset
from common.data.formats import (
    EMNIST_SPLITS,
    femnist_filename,
    mnist_filenames,
    read_emnist,
    read_mnist_like,
    read_tff_h5,
)
from common.data.synthetic import SYNTHETIC_CLASSES, synthetic_dataset
from common.options import ConfigError

__all__ = [
    "DATASET_NAMES",
    "SYSTEM_DIRS",
    "data_root",
    "dataset_num_classes",
    "download_dir",
    "femnist_path",
    "load_dataset",
    "resolve_data_dir",
]

DATASET_NAMES = ("synthetic", "emnist", "femnist", "mnist", "fashion-mnist")
# Folders where a distribution package installs a data set (searched last; tests may patch this).
SYSTEM_DIRS: dict[str, Path] = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}
FEMNIST_SPLITS = {"digits": 10, "byclass": 62}  # digits-only file, or the full 62-class file


def data_root(data_dir: str = "") -> Path:
    """The data root: ``data_dir`` if given, else ``$FEDGAN_DATA``, else ``./data``."""
    return Path(data_dir or os.environ.get("FEDGAN_DATA") or "data").expanduser().absolute()


def download_dir(dataset: str, data_dir: str = "") -> Path:
    """Where ``fedgan data download`` puts ``dataset``: its folder under the data root."""
    _check_name(dataset)
    return data_root(data_dir) / dataset


def _has_files(dataset: str, folder: Path) -> bool:
    """Whether ``folder`` holds at least one file of ``dataset`` (readers check the rest)."""
    if not folder.is_dir():
        return False
    if dataset in ("mnist", "fashion-mnist"):
        return any((folder / name).is_file() for split in ("train", "test") for name in mnist_filenames(split))
    if dataset == "emnist":
        return any(folder.glob("emnist-*-ubyte.gz"))
    if dataset == "femnist":
        return any(folder.glob("fed_emnist*.h5"))
    return False


def resolve_data_dir(dataset: str, data_dir: str = "") -> Path:
    """The folder holding ``dataset``'s files.

    Candidates in order: ``<root>/<dataset>``; ``data_dir`` itself when given explicitly (a folder
    of files); the system folder of a distribution package. The default root alone is never used
    directly because MNIST and Fashion-MNIST share file names. When nothing is found, the download
    folder is returned so that the reader's error names the place the files are expected.
    """
    _check_name(dataset)
    candidates = [data_root(data_dir) / dataset]
    if data_dir:
        candidates.append(Path(data_dir).expanduser().absolute())
    if dataset in SYSTEM_DIRS:
        candidates.append(SYSTEM_DIRS[dataset])
    return next((c for c in candidates if _has_files(dataset, c)), candidates[0])


def dataset_num_classes(name: str, emnist_split: str = "digits") -> int:
    """Number of label classes of a data set (EMNIST and FEMNIST depend on the split)."""
    _check_name(name)
    if name == "emnist":
        _check_emnist_split(emnist_split)
        return EMNIST_SPLITS[emnist_split]
    if name == "femnist":
        return FEMNIST_SPLITS[_check_femnist_split(emnist_split)]
    return SYNTHETIC_CLASSES if name == "synthetic" else 10


def femnist_path(data_dir: str, emnist_split: str, split: str) -> Path:
    """The TFF HDF5 file of FEMNIST for this split: digits-only for ``digits``, else the full file."""
    only_digits = _check_femnist_split(emnist_split) == "digits"
    return resolve_data_dir("femnist", data_dir) / femnist_filename(only_digits, split)


def load_dataset(
    name: str,
    data_dir: str = "",
    *,
    split: str = "train",
    emnist_split: str = "digits",
    seed: int = 0,
    synthetic_writers: int = 20,
    synthetic_samples_per_writer: int = 120,
) -> Dataset:
    """A whole data set in memory, in the common convention of :class:`Dataset`.

    ``seed`` and the ``synthetic_*`` arguments only concern the generated ``synthetic`` set (its
    ``test`` split has the same writers' styles with fresh samples); file-based sets ignore them.
    """
    num_classes = dataset_num_classes(name, emnist_split)
    if name == "synthetic":
        return synthetic_dataset(synthetic_writers, synthetic_samples_per_writer, seed=seed, split=split)
    if name == "femnist":
        path = femnist_path(data_dir, emnist_split, split)
        images, labels, writers, _ = read_tff_h5(path, num_classes=num_classes)
        return Dataset(images=images, labels=labels, num_classes=num_classes, writers=writers)
    folder = resolve_data_dir(name, data_dir)
    if name == "emnist":
        images, labels = read_emnist(folder, emnist_split, split)
    else:
        images, labels = read_mnist_like(folder, split, dataset=name)
    return Dataset(images=images, labels=labels, num_classes=num_classes, writers=None)


def _check_name(name: str) -> None:
    if name not in DATASET_NAMES:
        raise ConfigError(f"unknown data set {name!r}: choose one of {DATASET_NAMES}")


def _check_emnist_split(emnist_split: str) -> None:
    if emnist_split not in EMNIST_SPLITS:
        raise ConfigError(f"invalid emnist_split={emnist_split!r}: choose one of {tuple(EMNIST_SPLITS)}")


def _check_femnist_split(emnist_split: str) -> str:
    if emnist_split not in FEMNIST_SPLITS:
        raise ConfigError(
            f"invalid emnist_split={emnist_split!r} for femnist: TFF ships 'digits' (10 classes) and "
            f"'byclass' (the full 62-class file)"
        )
    return emnist_split
