"""Downstream utility: train on one side, test on the other; real data stands in for generated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.data import Dataset, load_dataset
from common.evaluation.classifier import DomainClassifier
from common.evaluation.utility import (
    MLP,
    build_classifier,
    gen2real,
    real2gen,
    train_eval,
)

SYNTH = {"synthetic_writers": 40, "synthetic_samples_per_writer": 50}  # 2000 train, 2000 test
CHANCE_MARGIN = 0.25  # 10 balanced classes: chance is 0.1


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def real() -> tuple[Dataset, Dataset]:
    return load_dataset("synthetic", **SYNTH), load_dataset("synthetic", split="test", **SYNTH)


def _shuffled(labels: np.ndarray) -> np.ndarray:
    """Labels carrying no information about their images, with the class balance kept."""
    return np.random.default_rng(0).permutation(labels)


def test_gen2real_with_real_data_is_high(real: tuple[Dataset, Dataset]) -> None:
    train, test = real
    result = gen2real(train.images, train.labels, test.images, test.labels, 10)
    # Measured: cnn 0.89, mlp 0.84; with shuffled labels below, 0.07 and 0.07.
    assert result["cnn"] > 0.8 and result["mlp"] > 0.75
    assert (result["num_train"], result["num_test"]) == (2000, 2000)


def test_gen2real_with_label_shuffled_samples_is_chance(real: tuple[Dataset, Dataset]) -> None:
    """Good-looking samples whose labels are wrong are useless: the metric sees what FID cannot."""
    train, test = real
    result = gen2real(train.images, _shuffled(train.labels), test.images, test.labels, 10)
    assert result["cnn"] < CHANCE_MARGIN and result["mlp"] < CHANCE_MARGIN


def test_real2gen_recognises_real_data_and_rejects_wrong_labels(real: tuple[Dataset, Dataset]) -> None:
    train, test = real
    good = real2gen(train.images, train.labels, test.images[:500], test.labels[:500], 10, archs=("mlp",))
    bad = real2gen(train.images, train.labels, test.images[:500], _shuffled(test.labels[:500]), 10, archs=("mlp",))
    assert set(good) == {"mlp", "num_train", "num_test"} and good["num_test"] == 500
    assert good["mlp"] > 0.7 and bad["mlp"] < CHANCE_MARGIN  # measured: 0.81 and 0.13


def test_train_eval_is_deterministic_per_seed(real: tuple[Dataset, Dataset]) -> None:
    train, test = real
    args = (train.images[:300], train.labels[:300], test.images[:300], test.labels[:300], 10)
    first = train_eval("mlp", *args, epochs=1, seed=5)
    assert train_eval("mlp", *args, epochs=1, seed=5) == first
    assert 0.0 <= first <= 1.0


def test_float_inputs_match_uint8_inputs(real: tuple[Dataset, Dataset]) -> None:
    """Generated images arrive as float tensors in [0, 1], real ones as uint8: both must work alike."""
    train, test = real
    as_float = torch.from_numpy(train.images[:300]).float().unsqueeze(1) / 255
    args = (test.images[:300], test.labels[:300], 10)
    from_uint8 = train_eval("mlp", train.images[:300], train.labels[:300], *args, epochs=1)
    from_float = train_eval("mlp", as_float, torch.from_numpy(train.labels[:300]), *args, epochs=1)
    assert from_float == pytest.approx(from_uint8)


def test_generator_outputs_are_detached(real: tuple[Dataset, Dataset]) -> None:
    """A generator's output still attached to its graph must not be trained through (or crash)."""
    train, test = real
    weight = torch.ones((), requires_grad=True)
    generated = (torch.from_numpy(train.images[:200]).float() / 255) * weight
    result = gen2real(generated, train.labels[:200], test.images[:200], test.labels[:200], 10, epochs=1)
    assert weight.grad is None and 0.0 <= result["cnn"] <= 1.0


def test_architectures() -> None:
    assert isinstance(build_classifier("cnn", 10), DomainClassifier)
    mlp = build_classifier("mlp", 62)
    assert isinstance(mlp, MLP) and mlp(torch.rand(2, 1, 28, 28)).shape == (2, 62)
    widths = [layer.out_features for layer in mlp.net if isinstance(layer, torch.nn.Linear)]
    assert widths == [256, 128, 62]
    with pytest.raises(ValueError, match="architecture"):
        build_classifier("resnet", 10)


def test_rejects_labels_outside_the_classes(real: tuple[Dataset, Dataset]) -> None:
    train, test = real
    with pytest.raises(ValueError, match="labels"):
        gen2real(train.images[:10], np.full(10, 10), test.images[:10], test.labels[:10], 10)
