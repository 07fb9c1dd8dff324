"""The domain classifier of a data set: trained once by the project, cached by a key over every input.

The reference network must stay fixed across the evaluations it is compared in, so its weights are
cached under ``<data dir>/.fedgan-cache/`` with a key over the data set, split, seed and recipe
(``classifier_cache_key``), and written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.data import Dataset, load_dataset, resolve_data_dir

from .classifier import CLASSIFIER_VERSION, FEATURE_DIM, DomainClassifier, accuracy, train_classifier


def classifier_cache_key(**inputs: object) -> str:
    """A short hex digest of every input that determines the trained weights (JSON, sorted keys)."""
    payload = json.dumps({"version": CLASSIFIER_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def load_or_train_domain_classifier(
    dataset: str,
    *,
    data_dir: str = "",
    emnist_split: str = "digits",
    cache_dir: Path,
    seed: int = 0,
    epochs: int = 3,
    batch_size: int = 128,
    max_train: int | None = 60000,
    synthetic_writers: int = 20,
    synthetic_samples_per_writer: int = 120,
    progress: bool = True,
) -> tuple[nn.Module, dict]:
    """The domain classifier of ``dataset``: from ``cache_dir`` when cached, else trained and cached.

    Trained on the real training split (at most ``max_train`` images, a seeded random subset) and
    scored on the whole real test split. The cache file ``classifier-<key>.pt`` holds the
    ``state_dict`` and the metadata; it is written atomically, and a file that cannot be read or
    does not match its key is replaced by a fresh training. Returns the model in eval mode and the
    metadata (``test_accuracy``, ``num_train``, ``num_test``, ...; ``cached`` says which path ran).
    """
    inputs = _cache_inputs(
        dataset,
        data_dir,
        emnist_split,
        seed,
        epochs,
        batch_size,
        max_train,
        synthetic_writers,
        synthetic_samples_per_writer,
    )
    key = classifier_cache_key(**inputs)
    path = Path(cache_dir) / f"classifier-{key}.pt"
    loaded = _load_cached(path, key)
    if loaded is not None:
        return loaded[0], {**loaded[1], "cached": True, "cache_path": str(path)}
    model, meta = _train_domain_classifier(inputs, data_dir, key, progress)
    _save_atomic(path, {"state_dict": model.state_dict(), "meta": meta})
    return model, {**meta, "cached": False, "cache_path": str(path)}


def _cache_inputs(
    dataset: str,
    data_dir: str,
    emnist_split: str,
    seed: int,
    epochs: int,
    batch_size: int,
    max_train: int | None,
    synthetic_writers: int,
    synthetic_samples_per_writer: int,
) -> dict:
    """Every input of the training, with the data folder resolved (``""`` and ``./data`` are one place)."""
    if max_train is not None and max_train < 1:
        raise ValueError(f"max_train must be >= 1 or None, got {max_train}")
    folder = "" if dataset == "synthetic" else str(resolve_data_dir(dataset, data_dir))
    return {
        "dataset": dataset,
        "data_folder": folder,
        "emnist_split": emnist_split,
        "seed": seed,
        "epochs": epochs,
        "batch_size": batch_size,
        "max_train": max_train,
        "synthetic_writers": synthetic_writers,
        "synthetic_samples_per_writer": synthetic_samples_per_writer,
    }


def _load_split(inputs: dict, data_dir: str, split: str) -> Dataset:
    return load_dataset(
        inputs["dataset"],
        data_dir,
        split=split,
        emnist_split=inputs["emnist_split"],
        seed=inputs["seed"],
        synthetic_writers=inputs["synthetic_writers"],
        synthetic_samples_per_writer=inputs["synthetic_samples_per_writer"],
    )


def _train_domain_classifier(inputs: dict, data_dir: str, key: str, progress: bool) -> tuple[nn.Module, dict]:
    """Train on the (subsampled) training split and measure accuracy on the test split."""
    train, test = _load_split(inputs, data_dir, "train"), _load_split(inputs, data_dir, "test")
    images, labels = train.images, train.labels
    if inputs["max_train"] is not None and len(labels) > inputs["max_train"]:
        keep = np.sort(np.random.default_rng(inputs["seed"]).permutation(len(labels))[: inputs["max_train"]])
        images, labels = images[keep], labels[keep]
    start = time.perf_counter()
    model = train_classifier(
        images,
        labels,
        train.num_classes,
        epochs=inputs["epochs"],
        batch_size=inputs["batch_size"],
        seed=inputs["seed"],
        progress=progress,
    )
    train_time_s = time.perf_counter() - start
    meta = {
        **inputs,
        "key": key,
        "version": CLASSIFIER_VERSION,
        "train_split": "train",
        "eval_split": "test",
        "num_classes": train.num_classes,
        "num_train": int(len(labels)),
        "num_test": int(len(test)),
        "test_accuracy": accuracy(model, test.images, test.labels),
        "feature_dim": FEATURE_DIM,
        "train_time_s": train_time_s,
    }
    return model, meta


def _load_cached(path: Path, key: str) -> tuple[nn.Module, dict] | None:
    """The cached model and metadata, or None when absent, unreadable or not this key's."""
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        meta = dict(payload["meta"])
        if meta.get("key") != key or meta.get("version") != CLASSIFIER_VERSION:
            raise ValueError("cache key or version mismatch")
        model = DomainClassifier(int(meta["num_classes"]), int(meta["feature_dim"]))
        model.load_state_dict(payload["state_dict"])
    except Exception as exc:  # noqa: BLE001 - any damage means "train again", never a crash
        warnings.warn(f"ignoring unreadable classifier cache {path} ({exc!r}); retraining", stacklevel=3)
        return None
    return model.eval(), meta


def _save_atomic(path: Path, payload: dict) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
