"""Readers of the real formats, on tiny files written in the exact official layouts."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from common.data import (
    DataError,
    dataset_num_classes,
    load_dataset,
    loading,
    resolve_data_dir,
)
from common.data.formats import (
    EMNIST_SPLITS,
    read_emnist,
    read_idx_images,
    read_mnist_like,
    read_tff_h5,
    read_tff_h5_writer,
    tff_writer_sizes,
)
from common.data.testing import (
    femnist_file,
    idx_bytes,
    write_emnist,
    write_mnist_like,
    write_tff_h5,
)


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 28, 28), dtype=np.uint8)


def _asymmetric(n: int) -> np.ndarray:
    """Images whose transpose differs: a bright top row and a dim left column."""
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    images[:, 0, :] = 200
    images[:, 1:, 0] = 50
    images[:, 5, 20] = np.arange(n, dtype=np.uint8)
    return images


# --- IDX (MNIST, Fashion-MNIST) -------------------------------------------------------------------


def test_idx_header_is_big_endian_with_official_magic(tmp_path: Path) -> None:
    raw = idx_bytes(_images(3), 2051)
    assert raw[:4] == b"\x00\x00\x08\x03"
    assert struct.unpack(">4I", raw[:16]) == (2051, 3, 28, 28)
    assert idx_bytes(np.arange(3), 2049)[:8] == b"\x00\x00\x08\x01\x00\x00\x00\x03"


@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_roundtrip(tmp_path: Path, split: str) -> None:
    images, labels = _images(7), np.arange(7) % 10
    write_mnist_like(tmp_path, images, labels, split)
    got_images, got_labels = read_mnist_like(tmp_path, split)
    assert got_images.dtype == np.uint8 and got_images.shape == (7, 28, 28)
    assert got_labels.dtype == np.int64
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)


def test_load_dataset_mnist_and_fashion_from_data_root(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "mnist", _images(5, 1), np.arange(5))
    write_mnist_like(tmp_path / "fashion-mnist", _images(6, 2), np.arange(6))
    mnist = load_dataset("mnist", str(tmp_path))
    fashion = load_dataset("fashion-mnist", str(tmp_path))
    assert (len(mnist), len(fashion)) == (5, 6)
    assert mnist.num_classes == fashion.num_classes == 10 and mnist.writers is None
    np.testing.assert_array_equal(fashion.images, _images(6, 2))


def test_missing_file_names_path_and_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path))
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in str(err.value)
    assert "fedgan data download mnist" in str(err.value)


def test_truncated_gzip_is_data_error(tmp_path: Path) -> None:
    path, _ = write_mnist_like(tmp_path, _images(20), np.zeros(20))
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(DataError, match="truncated") as err:
        read_idx_images(path)
    assert str(path) in str(err.value)


def test_not_gzip_is_data_error(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(DataError, match=str(path)):
        read_idx_images(path)


def test_wrong_magic_is_data_error(tmp_path: Path) -> None:
    labels_path = write_mnist_like(tmp_path, _images(4), np.arange(4))[1]
    with pytest.raises(DataError, match="magic number 2049, expected 2051"):
        read_idx_images(labels_path)  # a labels file where images are expected


def test_payload_shorter_than_header_is_data_error(tmp_path: Path) -> None:
    path = tmp_path / "imgs.gz"
    path.write_bytes(gzip.compress(idx_bytes(_images(5), 2051)[:-100]))
    with pytest.raises(DataError, match="truncated or corrupt"):
        read_idx_images(path)


def test_wrong_image_size_is_data_error(tmp_path: Path) -> None:
    path = tmp_path / "imgs.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((2, 32, 32)), 2051)))
    with pytest.raises(DataError, match="28x28"):
        read_idx_images(path)


def test_count_mismatch_and_label_range(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "a", _images(5), np.arange(4))
    with pytest.raises(DataError, match="5 images .* 4 labels"):
        read_mnist_like(tmp_path / "a", "train")
    write_mnist_like(tmp_path / "b", _images(2), np.array([3, 12]))
    with pytest.raises(DataError, match="labels in \\[3, 12\\]"):
        read_mnist_like(tmp_path / "b", "train")


# --- NIST EMNIST ----------------------------------------------------------------------------------


def test_emnist_images_are_untransposed(tmp_path: Path) -> None:
    upright = _asymmetric(4)
    write_emnist(tmp_path, "digits", upright, np.arange(4))
    stored = read_idx_images(tmp_path / "emnist-digits-train-images-idx3-ubyte.gz")
    np.testing.assert_array_equal(stored, upright.transpose(0, 2, 1))  # the file really is transposed
    images, labels = read_emnist(tmp_path, "digits", "train")
    np.testing.assert_array_equal(images, upright)
    assert images[0, 0, 5] == 200 and images[0, 5, 0] == 50 and images[3, 5, 20] == 3
    assert images.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(labels, np.arange(4))


def test_emnist_letters_labels_become_zero_based(tmp_path: Path) -> None:
    write_emnist(tmp_path, "letters", _images(3), np.array([1, 13, 26]), split="test")
    dataset = load_dataset("emnist", str(tmp_path), split="test", emnist_split="letters")
    np.testing.assert_array_equal(dataset.labels, [0, 12, 25])
    assert dataset.num_classes == 26


@pytest.mark.parametrize("split, classes", sorted(EMNIST_SPLITS.items()))
def test_emnist_every_split(tmp_path: Path, split: str, classes: int) -> None:
    labels = np.array([1, classes]) if split == "letters" else np.array([0, classes - 1])
    write_emnist(tmp_path / "emnist", split, _images(2), labels)
    dataset = load_dataset("emnist", str(tmp_path), emnist_split=split)
    assert dataset.num_classes == classes == dataset_num_classes("emnist", split)
    assert dataset.labels.max() == classes - 1


def test_emnist_missing_split_names_file(tmp_path: Path) -> None:
    write_emnist(tmp_path / "emnist", "digits", _images(2), np.arange(2))
    with pytest.raises(DataError, match="emnist-balanced-train-images-idx3-ubyte.gz.*fedgan data download emnist"):
        load_dataset("emnist", str(tmp_path), emnist_split="balanced")


# --- TFF federated EMNIST -------------------------------------------------------------------------


def _tff_writers() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    ink = _asymmetric(5)
    return {"f0001_45": (ink[:3], np.array([1, 2, 3])), "f0000_14": (ink[3:], np.array([7, 9]))}


def test_tff_h5_layout_and_conversion(tmp_path: Path) -> None:
    path = write_tff_h5(tmp_path / "fed_emnist_digitsonly_train.h5", _tff_writers())
    with h5py.File(path, "r") as handle:  # the file follows TFF's layout: white background
        pixels = handle["examples/f0000_14/pixels"][()]
        assert pixels.dtype == np.float32 and pixels.shape == (2, 28, 28) and pixels[0, 27, 27] == 1.0
    images, labels, writer_index, writer_ids = read_tff_h5(path, num_classes=10)
    assert writer_ids == ["f0000_14", "f0001_45"]  # sorted, as h5py lists groups
    np.testing.assert_array_equal(writer_index, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(labels, [7, 9, 1, 2, 3])
    assert images.dtype == np.uint8 and images[:, 27, 27].max() == 0  # background is 0 now
    np.testing.assert_array_equal(images[2:], _asymmetric(5)[:3])  # ink high, upright


def test_tff_single_writer_and_sizes(tmp_path: Path) -> None:
    path = write_tff_h5(tmp_path / "x.h5", _tff_writers())
    images, labels, writer_id = read_tff_h5_writer(path, 1, num_classes=10)
    assert writer_id == "f0001_45" and images.shape == (3, 28, 28)
    np.testing.assert_array_equal(labels, [1, 2, 3])
    assert tff_writer_sizes(path) == (["f0000_14", "f0001_45"], [2, 3])
    with pytest.raises(DataError, match="2 writers"):
        read_tff_h5_writer(path, 2, num_classes=10)


def test_femnist_load_dataset_variants(tmp_path: Path) -> None:
    folder = tmp_path / "femnist"
    write_tff_h5(femnist_file(folder, True, "test"), _tff_writers())
    write_tff_h5(femnist_file(folder, False, "train"), {"w": (_images(2), np.array([10, 61]))})
    digits = load_dataset("femnist", str(tmp_path), split="test", emnist_split="digits")
    assert digits.num_classes == 10 and digits.num_writers == 2
    full = load_dataset("femnist", str(tmp_path), emnist_split="byclass")
    assert full.num_classes == 62 and list(full.labels) == [10, 61]


def test_femnist_errors_name_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="fed_emnist_digitsonly_train.h5.*fedgan data download femnist"):
        load_dataset("femnist", str(tmp_path))
    bad = tmp_path / "femnist" / "fed_emnist_digitsonly_train.h5"
    bad.parent.mkdir()
    bad.write_bytes(b"\x89HDF\r\n garbage")
    with pytest.raises(DataError, match="not a readable HDF5"):
        load_dataset("femnist", str(tmp_path))
    with h5py.File(bad, "w") as handle:
        handle.create_group("snippets")
    with pytest.raises(DataError, match="no 'examples' group"):
        load_dataset("femnist", str(tmp_path))
    write_tff_h5(bad, {"w": (_images(1), np.array([35]))})  # a letter in the digits-only file
    with pytest.raises(DataError, match="expected 0..9"):
        load_dataset("femnist", str(tmp_path))


# --- where files are looked for -------------------------------------------------------------------


def test_resolve_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "SYSTEM_DIRS", {"fashion-mnist": tmp_path / "system"})
    monkeypatch.setenv("FEDGAN_DATA", str(tmp_path / "env"))
    assert resolve_data_dir("mnist", "") == tmp_path / "env" / "mnist"  # nothing there: the download place
    write_mnist_like(tmp_path / "system", _images(1), np.zeros(1))
    assert resolve_data_dir("fashion-mnist", "") == tmp_path / "system"
    write_mnist_like(tmp_path / "env" / "fashion-mnist", _images(1), np.zeros(1))
    assert resolve_data_dir("fashion-mnist", "") == tmp_path / "env" / "fashion-mnist"
    write_mnist_like(tmp_path / "flat", _images(1), np.zeros(1))  # an explicit folder of files
    assert resolve_data_dir("mnist", str(tmp_path / "flat")) == tmp_path / "flat"


def test_unknown_names_are_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("cifar10", "")
    with pytest.raises(ValueError, match="femnist"):
        dataset_num_classes("femnist", "letters")


def test_broken_femnist_writers_are_data_errors_naming_the_writer(tmp_path: Path) -> None:
    """Issue 14, item 12: NaN pixels, non-integer labels, the wrong dtype, `examples` as a dataset."""
    good = np.full((2, 28, 28), 0.5, np.float32)
    cases = {
        "nan": (np.full((2, 28, 28), np.nan, np.float32), np.array([1, 2], np.int32), "NaN or infinite"),
        "fractional": (good, np.array([1.5, 2.0], np.float32), "not integers"),
        "strings": (good, np.array([b"a", b"b"]), "labels of"),
    }
    for name, (pixels, labels, words) in cases.items():
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as handle:
            group = handle.create_group("examples").create_group("w0")
            group.create_dataset("pixels", data=pixels)
            group.create_dataset("label", data=labels)
        with pytest.raises(DataError, match=words) as err:
            read_tff_h5(path, num_classes=10)
        assert "'w0'" in str(err.value) and str(path) in str(err.value)
    flat = tmp_path / "flat.h5"
    with h5py.File(flat, "w") as handle:
        handle.create_dataset("examples", data=np.zeros(3))
    for read in (lambda: read_tff_h5(flat, num_classes=10), lambda: tff_writer_sizes(flat)):
        with pytest.raises(DataError, match="must be a group of writers"):
            read()
