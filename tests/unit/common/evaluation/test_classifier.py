"""The domain classifier, its cache, and the Inception Score computed from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import Dataset, load_dataset
from common.evaluation import domain_classifier as classifier
from common.evaluation.classifier import (
    DomainClassifier,
    accuracy,
    as_image_tensor,
    extract_features,
    inception_score,
    predict_proba,
    train_classifier,
)
from common.evaluation.domain_classifier import load_or_train_domain_classifier

# 50 writers x 100 samples: 5000 training and 5000 test images of 10 balanced classes.
SYNTH = {"synthetic_writers": 50, "synthetic_samples_per_writer": 100}
TRAIN = {"epochs": 3, "batch_size": 64, "progress": False}
TINY = {"synthetic_writers": 6, "synthetic_samples_per_writer": 20, "epochs": 1}


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("classifier-cache")


@pytest.fixture(scope="module")
def trained(cache_dir: Path) -> tuple[torch.nn.Module, dict]:
    """Trained once for the module (about 10 s on one core); the cache tests reuse its file."""
    return load_or_train_domain_classifier("synthetic", cache_dir=cache_dir, **TRAIN, **SYNTH)


@pytest.fixture(scope="module")
def real_test() -> Dataset:
    return load_dataset("synthetic", split="test", **SYNTH)


def test_architecture_size_and_outputs() -> None:
    model = DomainClassifier(10)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 400_000
    x = torch.rand(3, 1, 28, 28)
    assert model(x).shape == (3, 10)
    assert model.features(x).shape == (3, 128)


def test_classifier_learns_the_real_data(trained: tuple, real_test: Dataset) -> None:
    model, meta = trained
    # Measured: 0.977 test accuracy (chance is 0.1).
    assert meta["test_accuracy"] > 0.9
    assert meta["test_accuracy"] == pytest.approx(accuracy(model, real_test.images, real_test.labels))
    assert (meta["num_train"], meta["num_test"], meta["num_classes"]) == (5000, 5000, 10)
    assert (meta["dataset"], meta["train_split"], meta["eval_split"]) == ("synthetic", "train", "test")
    assert (meta["epochs"], meta["seed"], meta["cached"]) == (3, 0, False)
    assert not model.training


def test_inception_score_of_real_data_is_close_to_num_classes(trained: tuple, real_test: Dataset) -> None:
    model, _ = trained
    mean, std = inception_score(predict_proba(model, real_test.images))
    # Measured: 8.76 (std 0.29 over 10 splits) of a maximum of 10.
    assert 0.7 * real_test.num_classes < mean <= real_test.num_classes
    assert 0 <= std < 1


def test_features_and_probabilities(trained: tuple, real_test: Dataset) -> None:
    model, _ = trained
    features = extract_features(model, real_test.images[:100])
    assert features.shape == (100, 128) and np.isfinite(features).all() and (features >= 0).all()
    probs = predict_proba(model, real_test.images[:100])
    assert probs.shape == (100, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    # Batching must not change the results (no batch statistics in the network).
    np.testing.assert_allclose(extract_features(model, real_test.images[:100], batch_size=7), features, atol=1e-5)


def test_cache_hit_returns_the_same_model_without_training(
    trained: tuple, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, meta = trained
    path = Path(meta["cache_path"])
    mtime = path.stat().st_mtime_ns
    monkeypatch.setattr(classifier, "train_classifier", _must_not_train)
    again, again_meta = load_or_train_domain_classifier("synthetic", cache_dir=cache_dir, **TRAIN, **SYNTH)
    assert again_meta["cached"] and again_meta["test_accuracy"] == meta["test_accuracy"]
    assert path.stat().st_mtime_ns == mtime
    for name, value in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value)
    assert not again.training


def _must_not_train(*args: object, **kwargs: object) -> torch.nn.Module:
    raise AssertionError("a cache hit must not train")


def test_cache_key_covers_the_inputs(tmp_path: Path) -> None:
    _, first = load_or_train_domain_classifier("synthetic", cache_dir=tmp_path, seed=0, progress=False, **TINY)
    _, second = load_or_train_domain_classifier("synthetic", cache_dir=tmp_path, seed=1, progress=False, **TINY)
    _, third = load_or_train_domain_classifier(
        "synthetic", cache_dir=tmp_path, seed=0, max_train=50, progress=False, **TINY
    )
    assert len({first["cache_path"], second["cache_path"], third["cache_path"]}) == 3
    assert third["num_train"] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        Path(m["cache_path"]).name for m in (first, second, third)
    )  # no temporary files left behind


def test_corrupt_cache_is_retrained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, meta = load_or_train_domain_classifier("synthetic", cache_dir=tmp_path, progress=False, **TINY)
    path = Path(meta["cache_path"])
    path.write_bytes(b"not a torch file")
    calls = []
    real_train = classifier.train_classifier
    monkeypatch.setattr(classifier, "train_classifier", lambda *a, **k: calls.append(1) or real_train(*a, **k))
    with pytest.warns(UserWarning, match="unreadable classifier cache"):
        _, again = load_or_train_domain_classifier("synthetic", cache_dir=tmp_path, progress=False, **TINY)
    assert calls == [1] and not again["cached"]
    assert again["test_accuracy"] == meta["test_accuracy"]  # same seed, same weights
    _, third = load_or_train_domain_classifier("synthetic", cache_dir=tmp_path, progress=False, **TINY)
    assert third["cached"] and calls == [1]


def test_training_is_deterministic_per_seed_and_leaves_the_global_rng_alone() -> None:
    data = load_dataset("synthetic", synthetic_writers=4, synthetic_samples_per_writer=20)
    rng_state = torch.get_rng_state()
    a = train_classifier(data.images, data.labels, 10, epochs=1, seed=3)
    b = train_classifier(data.images, data.labels, 10, epochs=1, seed=3)
    c = train_classifier(data.images, data.labels, 10, epochs=1, seed=4)
    assert torch.equal(torch.get_rng_state(), rng_state)
    torch.testing.assert_close(a.fc2.weight, b.fc2.weight, rtol=0, atol=0)
    assert not torch.equal(a.fc2.weight, c.fc2.weight)


def test_image_conversion() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(4, 28, 28), dtype=np.uint8)
    x = as_image_tensor(images)
    assert x.shape == (4, 1, 28, 28) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.from_numpy(images).float().unsqueeze(1) / 255)
    torch.testing.assert_close(as_image_tensor(x), x)
    with pytest.raises(ValueError, match="28"):
        as_image_tensor(np.zeros((4, 32, 32), dtype=np.uint8))
    with pytest.raises(ValueError, match="labels"):
        train_classifier(images, np.array([0, 1, 2, 10]), 10, epochs=1)


def test_inception_score_extremes() -> None:
    classes, n = 10, 1000
    one_hot = np.eye(classes)[np.arange(n) % classes]
    mean, std = inception_score(one_hot)
    assert mean == pytest.approx(classes) and std == pytest.approx(0, abs=1e-9)
    assert inception_score(np.full((n, classes), 1 / classes))[0] == pytest.approx(1.0)
    # Confident but all the same class: no diversity, the score collapses to 1.
    assert inception_score(np.eye(classes)[np.zeros(n, dtype=int)])[0] == pytest.approx(1.0)


def test_inception_score_matches_the_reference_formula() -> None:
    probs = np.random.default_rng(0).dirichlet(np.full(10, 0.3), size=500)
    expected = []
    for part in np.split(probs, 5):  # Salimans et al.'s improved-gan code, written out
        kl = part * (np.log(part) - np.log(part.mean(axis=0, keepdims=True)))
        expected.append(np.exp(kl.sum(axis=1).mean()))
    mean, std = inception_score(probs, splits=5)
    assert mean == pytest.approx(np.mean(expected)) and std == pytest.approx(np.std(expected))


@pytest.mark.parametrize(
    "probs, splits",
    [(np.full((5, 3), 0.5), 1), (-np.eye(3), 1), (np.eye(3), 4), (np.ones(3) / 3, 1), (np.eye(3), 0)],
)
def test_inception_score_rejects_bad_input(probs: np.ndarray, splits: int) -> None:
    with pytest.raises(ValueError):
        inception_score(probs, splits=splits)
