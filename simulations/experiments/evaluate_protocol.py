"""``fedgan evaluate RUN --protocol dpimagebench[-cpu]``: a run's generator under the anchors' protocol.

The quick evaluation (our two small classifiers, 3 epochs, FID at a few hundred samples) stays the
default of every run; this one answers "how does this compare with DPImageBench's published rows",
and costs accordingly (``common/evaluation/anchors.py`` says what it fixes and why). Its figures go
into ``eval.json`` under ``"protocol"`` and stay there: the selection reads 5,000 real training
images (with DPImageBench's Laplace noise, which no ledger counts, theirs included) and the FID is
against the training split, so neither is published beside the generator.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from common.data import Dataset
from common.data.protocol import protocol_validation
from common.device import resolve_device
from common.evaluation.anchors import Recipe, protocol_accuracy, recipe
from common.evaluation.fid import cached_stats, feature_stats, frechet_distance
from common.methods import ExperimentConfig

PROTOCOL_SEED = 0
NOT_PUBLISHED = (
    "operator only: model selection on 5,000 real training images (Laplace(1/ε) as DPImageBench, not in "
    "any ledger) and FID against the real training split"
)


def _as_tensors(ds: Dataset, idx: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = (ds.images, ds.labels) if idx is None else (ds.images[idx], ds.labels[idx])
    images, labels = np.array(images), np.array(labels)  # writable copies: a loaded set may be read-only
    return torch.from_numpy(images).float().div(255.0).unsqueeze(1), torch.from_numpy(labels).long()


def protocol_splits(train: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(the training indices the generator would be trained on under the protocol, the validation ones)."""
    val = protocol_validation(len(train.labels))
    keep = np.setdiff1d(np.arange(len(train.labels)), val)
    return keep, val


def evaluate_protocol(
    evaluator: Any,
    gen: torch.nn.Module,
    name: str,
    *,
    epsilon: float | None,
    generate: Any,
    progress: bool = True,
) -> dict[str, Any]:
    """The protocol ``name`` on ``gen`` with the quick evaluator's data and Inception network.

    ``epsilon``: the run's per-client ε (None or ∞ for a run without noise), the scale of the
    selection's Laplace noise as DPImageBench sets it."""
    spec = recipe(name)
    cfg: ExperimentConfig = evaluator.cfg
    eps = math.inf if epsilon is None else float(epsilon)
    say = (lambda msg: print(f"fedgan: {msg}", flush=True)) if progress else None
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    keep, val = protocol_splits(evaluator.train)
    n = spec.synthetic_size
    images, labels = generate(gen, max(n, spec.fid_samples), num_classes=evaluator.num_classes, z_dim=cfg.z_dim)
    accuracy = protocol_accuracy(
        (images[:n], labels[:n]),
        _as_tensors(evaluator.train, val),
        _as_tensors(evaluator.test),
        evaluator.num_classes,
        spec,
        epsilon=eps,
        seed=PROTOCOL_SEED,
        device=device,
        progress=say,
    )
    result = {
        **accuracy,
        "validation_in_training": _validation_in_training(cfg),
        "fid": _fid(evaluator, spec, images, keep, say),
        "publishable": False,
        "data": NOT_PUBLISHED,
        "wall_s": time.perf_counter() - start,
        "device": device_label(device),
    }
    return result


def device_label(device: torch.device) -> str:
    """Where the classifiers trained ("cpu" or the GPU's name): the same recipe on another device
    differs by rounding and by its kernels' nondeterminism, so a table that mixes them says which."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _validation_in_training(cfg: ExperimentConfig) -> bool:
    """Whether the run's clients held the protocol's validation images (true unless the run held
    them out, as DPImageBench's generators never see them): a selection on seen images flatters."""
    return not cfg.protocol_holdout


def _fid(evaluator: Any, spec: Recipe, images: torch.Tensor, keep: np.ndarray, say: Any) -> dict[str, Any]:
    """Inception FID of the first N synthetic images against N real training images (the 55,000 the
    protocol trains on, a seeded subset), N = the recipe's; None when no Inception network loaded."""
    inception = evaluator.inception
    n = min(spec.fid_samples, len(keep))
    if inception is None:
        return {"value": None, "num_samples": n, "note": evaluator.inception_note or "Inception disabled"}
    subset = np.sort(np.random.default_rng(PROTOCOL_SEED).permutation(keep)[:n])
    if say:
        say(f"{spec.name}: Inception FID at N = {n} against the training split")
    key = f"protocol-train-{evaluator.cfg.dataset}-{len(evaluator.train.labels)}-{n}-{inception.name}"
    real = cached_stats(
        evaluator.cache / f"inception-stats-{key}.npz",
        lambda: inception(_as_tensors(evaluator.train, subset)[0], progress=evaluator.progress),
    )
    fake = feature_stats(inception(images[:n], progress=evaluator.progress))
    return {"value": frechet_distance(real, fake), "num_samples": n, "num_real": n, "reference": "training split"}


def format_protocol(result: dict[str, Any]) -> str:
    """Two terminal lines: the protocol's accuracy (mean ± std over its three classifiers, each
    one's) and its FID, with what they rest on."""
    per = ", ".join(f"{k} {v['test_acc']:.1%}" for k, v in result["classifiers"].items())
    seen = " (the run trained on its validation images: rerun with --protocol-holdout)" * bool(
        result["validation_in_training"]
    )
    fid = result["fid"]
    fid_text = (
        "not computed" if fid["value"] is None else f"{fid['value']:.1f} (N = {fid['num_samples']}, vs training split)"
    )
    return (
        f"{result['protocol']}: gen2real {result['mean']:.1%} ± {result['std']:.1%} ({per}; selected by "
        f"{result['selection']}{seen}; noiseless selection {result['mean_noiseless_selection']:.1%})\n"
        f"{result['protocol']}: FID {fid_text}; {result['wall_s']:.0f} s"
    )
