"""Partitioners and what one client receives for a config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.data import (
    DataError,
    PartitionError,
    apply_inversion,
    check_partition_sizes,
    class_balance,
    clear_cache,
    invert_clients,
    load_client_partition,
    loading,
    num_classes_for,
    partition_by_writer,
    partition_dirichlet,
    partition_iid,
    partition_shards,
)
from common.data.testing import (
    femnist_file,
    write_emnist,
    write_mnist_like,
    write_tff_h5,
)
from common.methods import ExperimentConfig


def _assert_disjoint(parts: list[np.ndarray], n: int) -> np.ndarray:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "a sample is held by two clients"
    assert joined.min(initial=0) >= 0 and joined.max(initial=0) < max(n, 1)
    assert all(p.dtype == np.int64 for p in parts)
    return joined


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 500), k=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_iid_covers_disjoint_balanced(n: int, k: int, seed: int) -> None:
    if k > n:
        with pytest.raises(PartitionError):
            partition_iid(n, k, seed=seed)
        return
    parts = partition_iid(n, k, seed=seed)
    assert len(_assert_disjoint(parts, n)) == n
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_iid(n, k, seed=seed), strict=False))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 30), size=st.integers(1, 20), extra=st.integers(0, 50), seed=st.integers(0, 1000))
def test_shards_equal_disjoint_leftover_dropped(k: int, size: int, extra: int, seed: int) -> None:
    n = k * size + extra
    parts = partition_shards(n, k, seed=seed, shard_size=size)
    _assert_disjoint(parts, n)
    assert [len(p) for p in parts] == [size] * k


def test_shards_gswgan_shape() -> None:
    """GS-WGAN's 1000 x 60 of 60,000 MNIST images, at a tenth of the scale, plus leftovers."""
    parts = partition_shards(6_037, 100, seed=0, shard_size=60)
    assert len(parts) == 100 and {len(p) for p in parts} == {60}
    assert len(_assert_disjoint(parts, 6_037)) == 6_000
    assert [len(p) for p in partition_shards(6_037, 100, seed=0)] == [60] * 100  # default n // K
    with pytest.raises(PartitionError, match="need 6100"):
        partition_shards(6_037, 100, seed=0, shard_size=61)


def test_by_writer() -> None:
    writers = np.array([2, 0, 1, 0, 2, 2, 1])
    parts = partition_by_writer(writers, 3)
    assert [p.tolist() for p in parts] == [[1, 3], [2, 6], [0, 4, 5]]
    assert [p.tolist() for p in partition_by_writer(writers, 2)] == [[1, 3], [2, 6]]
    with pytest.raises(PartitionError, match="4 is more than the 3 writers"):
        partition_by_writer(writers, 4)


def _labels(n: int = 3000, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(0).integers(0, classes, n)


def _skew(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean share of a client's largest class: 0.1 for iid over 10 classes, 1.0 for one class each."""
    return float(np.mean([class_balance(labels[p], 10).max() for p in parts]))


def test_dirichlet_disjoint_covering_min_size_deterministic() -> None:
    labels = _labels()
    parts = partition_dirichlet(labels, 10, alpha=0.5, seed=1, min_size=20)
    assert len(_assert_disjoint(parts, len(labels))) == len(labels)
    assert min(len(p) for p in parts) >= 20
    again = partition_dirichlet(labels, 10, alpha=0.5, seed=1, min_size=20)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=False))


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    labels = _labels()
    skews = [_skew(partition_dirichlet(labels, 10, alpha=a, seed=0, min_size=5), labels) for a in (100.0, 1.0, 0.1)]
    assert skews[0] < 0.2 < skews[1] < skews[2]
    assert skews[2] > 0.5


def test_dirichlet_impossible_min_size_is_clear() -> None:
    with pytest.raises(PartitionError, match="raise alpha"):
        partition_dirichlet(_labels(200), 10, alpha=0.01, seed=0, min_size=19, max_tries=20)


def test_inversion_fraction_and_determinism() -> None:
    flags = invert_clients(20_000, 0.3, seed=0)
    assert flags.dtype == bool and abs(flags.mean() - 0.3) < 0.015
    np.testing.assert_array_equal(flags, invert_clients(20_000, 0.3, seed=0))
    assert not invert_clients(50, 0.0, seed=0).any() and invert_clients(50, 1.0, seed=0).all()
    images = np.array([[[0, 10], [255, 128]]], dtype=np.uint8)
    np.testing.assert_array_equal(apply_inversion(images), [[[255, 245], [0, 127]]])
    np.testing.assert_array_equal(apply_inversion(apply_inversion(images)), images)


# --- per-client loading ---------------------------------------------------------------------------


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    write_mnist_like(tmp_path / "mnist", rng.integers(0, 256, (400, 28, 28), dtype=np.uint8), np.arange(400) % 10)
    clear_cache()
    yield tmp_path
    clear_cache()


def _cfg(root: Path, **overrides) -> ExperimentConfig:
    base = dict(dataset="mnist", data_dir=str(root), partition="iid", num_clients=4, batch_size=8)
    return ExperimentConfig(**{**base, **overrides})


def test_clients_of_one_config_are_disjoint_and_read_files_once(mnist_root: Path, monkeypatch) -> None:
    reads = []
    real = loading.read_mnist_like
    monkeypatch.setattr(loading, "read_mnist_like", lambda *a, **k: reads.append(a) or real(*a, **k))
    for partition in ("iid", "shards", "dirichlet"):
        cfg = _cfg(mnist_root, partition=partition)
        data = [load_client_partition(cfg, k) for k in range(4)]
        flat = np.concatenate([d.images.reshape(len(d), -1).numpy() for d in data])
        assert len(np.unique(flat, axis=0)) == len(flat)  # no image held twice (random pixels are unique)
        assert data[0].images.shape[1:] == (1, 28, 28) and 0 <= data[0].images.min() <= data[0].images.max() <= 1
        assert sum(map(len, data)) == 400
    assert len(reads) == 1


def test_inverted_clients_match_the_draw(mnist_root: Path) -> None:
    cfg = _cfg(mnist_root, invert_prob=0.5, seed=3)
    flags = invert_clients(4, 0.5, seed=3)
    plain = _cfg(mnist_root, seed=3)
    for k in range(4):
        got, ref = load_client_partition(cfg, k), load_client_partition(plain, k)
        assert got.inverted == bool(flags[k])
        expected = 1.0 - ref.images if flags[k] else ref.images
        np.testing.assert_allclose(got.images.numpy(), expected.numpy(), atol=1e-6)


def test_check_partition_sizes_names_batch_size(mnist_root: Path) -> None:
    cfg = _cfg(mnist_root)
    assert check_partition_sizes(cfg, need=cfg.batch_size) == [100] * 4
    with pytest.raises(ValueError, match="batch_size=128") as err:
        check_partition_sizes(_cfg(mnist_root, batch_size=128), need=128)
    assert isinstance(err.value, DataError)


def test_writer_partition_needs_writers(mnist_root: Path) -> None:
    with pytest.raises(PartitionError, match="writer ids"):
        load_client_partition(_cfg(mnist_root, partition="writer"), 0)
    with pytest.raises(ValueError, match="client_id"):
        load_client_partition(_cfg(mnist_root), 4)


def test_emnist_and_synthetic_iid(tmp_path: Path) -> None:
    clear_cache()
    write_emnist(tmp_path / "emnist", "letters", np.zeros((40, 28, 28), np.uint8), np.arange(40) % 26 + 1)
    cfg = ExperimentConfig(
        dataset="emnist",
        emnist_split="letters",
        data_dir=str(tmp_path),
        partition="iid",
        num_clients=2,
        batch_size=4,
    )
    assert num_classes_for(cfg) == 26 and len(load_client_partition(cfg, 1)) == 20
    syn = ExperimentConfig(
        partition="iid", num_clients=3, synthetic_writers=5, synthetic_samples_per_writer=12, batch_size=4
    )
    assert check_partition_sizes(syn, need=syn.batch_size) == [20] * 3


def test_femnist_client_reads_only_its_writer(tmp_path: Path, monkeypatch) -> None:
    clear_cache()
    writers = {f"f{w:04d}_00": (np.full((w + 2, 28, 28), w, np.uint8), np.arange(w + 2) % 10) for w in range(3)}
    write_tff_h5(femnist_file(tmp_path / "femnist", True), writers)
    monkeypatch.setattr(loading, "read_tff_h5", lambda *a, **k: pytest.fail("whole file read"))
    cfg = ExperimentConfig(dataset="femnist", data_dir=str(tmp_path), partition="writer", num_clients=3, batch_size=2)
    client = load_client_partition(cfg, 2)
    assert len(client) == 4 and np.allclose(client.images.numpy(), 2 / 255.0)
    assert check_partition_sizes(cfg, need=cfg.batch_size) == [2, 3, 4]
    with pytest.raises(PartitionError, match="4 is more than the 3 writers"):
        load_client_partition(cfg.replace(num_clients=4, clients_per_step=1), 0)
