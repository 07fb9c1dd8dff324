"""The embedded synthetic writers: deterministic, per-writer, balanced, styled, fast."""

from __future__ import annotations

import time

import numpy as np
import pytest

from common.config import ConfigError
from common.data import (
    clear_cache,
    load_client_partition,
    load_dataset,
    loading,
    synthetic_dataset,
    synthetic_writer,
)
from common.data.synthetic import MAX_WRITERS, synthetic_writer_labels, writer_style
from common.methods import ExperimentConfig


def test_shape_dtype_and_ink() -> None:
    images, labels = synthetic_writer(0, 30, seed=0)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (30,) and labels.dtype == np.int64
    assert (images.reshape(30, -1).max(1) > 200).all()  # every glyph reaches near-full ink
    ink_fraction = (images > 0).mean(axis=(1, 2))
    assert ((ink_fraction > 0.04) & (ink_fraction < 0.5)).all()  # strokes, not blank or filled
    border = np.concatenate([images[:, 0], images[:, -1], images[:, :, 0], images[:, :, -1]], axis=1)
    assert border.mean() < 5  # background at the border, like MNIST


def test_deterministic_per_seed_and_writer() -> None:
    a, la = synthetic_writer(7, 20, seed=3)
    b, lb = synthetic_writer(7, 20, seed=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(a, synthetic_writer(7, 20, seed=4)[0])
    assert not np.array_equal(a, synthetic_writer(8, 20, seed=3)[0])


def test_writer_is_independent_of_the_others() -> None:
    """A client generating only its writer gets exactly that writer's slice of the whole set."""
    dataset = synthetic_dataset(6, 25, seed=1)
    images, labels = synthetic_writer(4, 25, seed=1)
    np.testing.assert_array_equal(dataset.images[dataset.writers == 4], images)
    np.testing.assert_array_equal(dataset.labels[dataset.writers == 4], labels)
    assert dataset.num_writers == 6 and dataset.num_classes == 10


def test_labels_balanced_and_available_without_rendering() -> None:
    for n in (10, 37, 120):
        labels = synthetic_writer(2, n, seed=0)[1]
        counts = np.bincount(labels, minlength=10)
        assert counts.max() - counts.min() <= 1
        np.testing.assert_array_equal(labels, synthetic_writer_labels(2, n, seed=0))


def test_test_split_has_fresh_samples_of_the_same_style() -> None:
    train, _ = synthetic_writer(3, 20, seed=0, split="train")
    test, _ = synthetic_writer(3, 20, seed=0, split="test")
    assert not np.array_equal(train, test)
    dataset = load_dataset("synthetic", "", split="test", synthetic_writers=2, synthetic_samples_per_writer=20)
    np.testing.assert_array_equal(dataset.images[:20], synthetic_writer(0, 20, seed=0, split="test")[0])


def _nearest_mean_accuracy(train_x, train_y, test_x, test_y) -> float:
    classes = np.unique(train_y)
    means = np.stack([train_x[train_y == c].mean(0) for c in classes])
    dist = ((test_x[:, None, :] - means[None]) ** 2).sum(-1)
    return float((classes[dist.argmin(1)] == test_y).mean())


def test_digits_are_recognisable_across_writers() -> None:
    """Class means of some writers classify other writers' digits far above chance (10%)."""
    train = synthetic_dataset(12, 60, seed=0)
    test = synthetic_dataset(18, 60, seed=0)
    held_out = test.writers >= 12
    x_train = train.images.reshape(len(train), -1) / 255.0
    x_test = test.images[held_out].reshape(held_out.sum(), -1) / 255.0
    assert _nearest_mean_accuracy(x_train, train.labels, x_test, test.labels[held_out]) > 0.5


def test_writers_have_distinct_styles() -> None:
    """Per writer and digit means identify the writer of held-out samples far above chance (1/6)."""
    writers = [synthetic_writer(w, 60, seed=0) for w in range(6)]
    correct = []
    for digit in range(10):
        means = [x[y == digit][:3].mean(0) for x, y in writers]
        for w, (x, y) in enumerate(writers):
            for sample in x[y == digit][3:]:
                dist = [((sample.astype(float) - m) ** 2).sum() for m in means]
                correct.append(int(np.argmin(dist)) == w)
    assert np.mean(correct) > 0.6
    styles = [writer_style(w, seed=0) for w in range(20)]
    assert np.std([s.slant for s in styles]) > 0.05 and np.std([s.width_px for s in styles]) > 0.2


def test_fast_enough() -> None:
    synthetic_writer(0, 10, seed=0)  # warm-up
    start = time.process_time()
    synthetic_dataset(20, 120, seed=0)
    assert time.process_time() - start < 2.0  # target is well under 1 s; slack for loaded CI machines


def test_client_generates_only_its_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cache()

    def forbidden(*args, **kwargs):
        raise AssertionError("the whole synthetic data set was generated")

    monkeypatch.setattr(loading, "synthetic_dataset", forbidden)
    cfg = ExperimentConfig(num_clients=3400, synthetic_writers=3400, synthetic_samples_per_writer=40, seed=5)
    client = load_client_partition(cfg, 3399)
    images, labels = synthetic_writer(3399, 40, seed=5)
    assert client.images.shape == (40, 1, 28, 28) and client.images.dtype.is_floating_point
    np.testing.assert_allclose(client.images[:, 0].numpy(), images / 255.0, atol=1e-6)
    np.testing.assert_array_equal(client.labels.numpy(), labels)
    assert client.client_id == 3399 and not client.inverted


def test_a_federation_of_a_hundred_thousand_writers_renders_only_the_client_asked(monkeypatch) -> None:
    """Writers are seeds, so the set is not limited to FEMNIST's 3,400 (synthetic_writers=100000 was
    refused, although num_clients=100000 with synthetic_writers=0 already meant as many writers)."""
    clear_cache()

    def forbidden(*args, **kwargs):
        raise AssertionError("the whole synthetic data set was generated")

    monkeypatch.setattr(loading, "synthetic_dataset", forbidden)
    cfg = ExperimentConfig(num_clients=100_000, synthetic_writers=100_000, synthetic_samples_per_writer=32, seed=5)
    client = load_client_partition(cfg, 99_999)
    images, _ = synthetic_writer(99_999, 32, seed=5)
    np.testing.assert_allclose(client.images[:, 0].numpy(), images / 255.0, atol=1e-6)
    with pytest.raises(ConfigError, match="synthetic_writers"):
        ExperimentConfig(num_clients=10, synthetic_writers=MAX_WRITERS + 1)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        synthetic_writer(-1, 5, seed=0)
    with pytest.raises(KeyError):
        synthetic_writer(0, 5, seed=0, split="validation")
