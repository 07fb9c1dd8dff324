"""``fedgan evaluate RUN_DIR``: quality and utility of a run's released generator, with plots and a report.

Writes ``eval.json`` and ``report.html`` (plus ``plots/*.png``) into the run directory. Figures:
``fid`` (TF-FID Inception pool3, pytorch-fid's Fréchet distance), ``fid_domain`` (the same distance
on the penultimate features of a classifier trained on the real training split), ``inception_score``
(that classifier, 10 splits), ``gen2real_acc`` / ``real2gen_acc`` (CNN and MLP), each with the
number of samples used, and the ε summary of the run. Real-data statistics and the classifier are
computed once and cached under ``<data root>/.fedgan-cache``.

Each figure says which data it was computed from and whether it may be published (``PROVENANCE``):
the domain classifier (domain FID, IS) and real2gen's classifier are trained on the real *training*
split, the clients' own data, with no noise and no ledger, so those figures stay in the operator's
eval.json; the Inception FID (a public network, held-out test images) and gen2real (trained on
generated data, tested on held-out test images) also go into publish/release.json.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.data import Dataset, data_root, load_dataset, num_classes_for
from common.device import resolve_device
from common.evaluation.beside import BesideFigure, headline_kind
from common.evaluation.classifier import (
    extract_features,
    inception_score,
    predict_proba,
)
from common.evaluation.domain_classifier import load_or_train_domain_classifier
from common.evaluation.fid import FeatureStats, cached_stats, feature_stats, frechet_distance
from common.evaluation.plots import plot_epsilon_per_client, plot_epsilon_vs_fid, plot_training_curves
from common.evaluation.quality import quality_warnings
from common.evaluation.report import format_eval_table, write_report
from common.evaluation.utility import gen2real, real2gen
from common.learning.models import build_generator, device_of, sample_latent
from common.methods import ExperimentConfig
from server.release import add_publishable_eval
from server.reporting import RunDirectory, RunDirectoryError, check_writable

from .run_files import read_run_summary

EVAL_SEED = 2024
# The synthetic set's evaluation data come from at most this many of the run's writers (60,000
# training images at 120 per writer, MNIST's size): a 3,400-writer federation otherwise rendered
# 800,000 images and trained the domain classifier on 400,000 of them before the first figure.
EVAL_SYNTHETIC_WRITERS = 500


def eval_writers(cfg: ExperimentConfig) -> int:
    """The synthetic writers whose train and test splits the evaluation reads."""
    return min(cfg.synthetic_writers or cfg.num_clients, EVAL_SYNTHETIC_WRITERS)


def load_generator(cfg: ExperimentConfig, state: dict[str, torch.Tensor], source: Path) -> torch.nn.Module:
    """The released generator of ``cfg``'s architecture with ``state``; a mismatch is a clear error."""
    gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes_for(cfg))
    try:
        gen.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as err:
        raise RunDirectoryError(
            f"the generator in {source} does not match config.json (model={cfg.model}, "
            f"z_dim={cfg.z_dim}, {num_classes_for(cfg)} classes): {err}"
        ) from err
    return gen.to(resolve_device(cfg.device)).eval()


@torch.no_grad()
def generate(
    gen: torch.nn.Module, num_samples: int, *, num_classes: int, z_dim: int, batch_size: int = 500
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_samples`` images with balanced labels, from fixed latents (comparable across runs),
    drawn on the CPU whatever ``gen``'s device; the images come back on the CPU."""
    rng = torch.Generator().manual_seed(EVAL_SEED)
    labels = torch.arange(num_samples) % num_classes
    device = device_of(gen)
    chunks = [
        gen(sample_latent(len(y), z_dim, generator=rng).to(device), y.to(device)).cpu()
        for y in labels.split(batch_size)
    ]
    return torch.cat(chunks).clamp(0, 1), labels


def _real_subset(ds: Dataset, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = np.random.default_rng(EVAL_SEED).permutation(len(ds.labels))[:n]
    images = torch.from_numpy(ds.images[idx]).float().div(255.0).unsqueeze(1)
    return images, torch.from_numpy(ds.labels[idx]).long()


def _data_key(cfg: ExperimentConfig, split: str, n: int, extractor: str) -> str:
    parts = [cfg.dataset, cfg.emnist_split, str(cfg.data_dir), split, str(n), extractor, str(EVAL_SEED)]
    if cfg.dataset == "synthetic":
        parts += [str(cfg.seed), str(eval_writers(cfg)), str(cfg.synthetic_samples_per_writer)]
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:16]


class Evaluator:
    """Holds what every generator of one run is compared against (loaded once, reused for snapshots)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        num_samples: int,
        fid_samples: int,
        inception: bool,
        inception_weights: str,
        progress: bool,
    ) -> None:
        self.cfg, self.n, self.progress = cfg, num_samples, progress
        self.num_classes = num_classes_for(cfg)
        self.cache = data_root(cfg.data_dir) / ".fedgan-cache"
        kwargs = dict(
            emnist_split=cfg.emnist_split,
            seed=cfg.seed,
            synthetic_writers=eval_writers(cfg),
            synthetic_samples_per_writer=cfg.synthetic_samples_per_writer,
        )
        self.train = load_dataset(cfg.dataset, cfg.data_dir, split="train", **kwargs)
        self.test = load_dataset(cfg.dataset, cfg.data_dir, split="test", **kwargs)
        self.classifier, self.classifier_meta = load_or_train_domain_classifier(
            cfg.dataset, data_dir=cfg.data_dir, cache_dir=self.cache, progress=progress, **kwargs
        )
        self.real_images, self.real_labels = _real_subset(self.test, max(num_samples, fid_samples))
        self.fid_n = min(fid_samples, len(self.real_labels))
        self.real_domain = cached_stats(
            self.cache / f"domain-stats-{_data_key(cfg, 'test', len(self.real_labels[: self.n]), 'domain')}.npz",
            lambda: extract_features(self.classifier, self.real_images[: self.n]),
        )
        self.inception, self.inception_note = None, ""
        if inception:
            self._load_inception(inception_weights or None)

    def _load_inception(self, weights: str | None) -> None:
        from common.evaluation.inception import InceptionFeatureExtractor

        try:
            self.inception = InceptionFeatureExtractor(weights, device=resolve_device(self.cfg.device))
        except (FileNotFoundError, ValueError) as err:
            self.inception_note = f"Inception FID not computed: {err}"
            return
        key = _data_key(self.cfg, "test", self.fid_n, self.inception.name)
        self.real_inception = cached_stats(
            self.cache / f"inception-stats-{key}.npz",
            lambda: self.inception(self.real_images[: self.fid_n], progress=self.progress),
        )

    def fid_domain(self, images: torch.Tensor) -> float:
        return frechet_distance(self.real_domain, feature_stats(extract_features(self.classifier, images)))

    def fid(self, images: torch.Tensor) -> float | None:
        if self.inception is None:
            return None
        gen_stats: FeatureStats = feature_stats(self.inception(images[: self.fid_n], progress=self.progress))
        return frechet_distance(self.real_inception, gen_stats)

    def evaluate(self, gen: torch.nn.Module, *, utility: bool = True) -> dict[str, Any]:
        images, labels = generate(gen, max(self.n, self.fid_n), num_classes=self.num_classes, z_dim=self.cfg.z_dim)
        fid_images, images, labels = images[: self.fid_n], images[: self.n], labels[: self.n]
        real_images, real_labels = self.real_images[: self.n], self.real_labels[: self.n]
        n_real = len(real_labels)
        is_mean, is_std = inception_score(predict_proba(self.classifier, images), splits=10)
        result: dict[str, Any] = {
            "fid": {
                "value": self.fid(fid_images),
                "num_samples": self.fid_n,
                "num_real": self.fid_n,
                "network": getattr(self.inception, "name", None),
                "note": self.inception_note or None,
            },
            "fid_domain": {
                "value": self.fid_domain(images),
                "num_samples": self.n,
                "num_real": n_real,
                "classifier_test_accuracy": self.classifier_meta.get("test_accuracy"),
            },
            "inception_score": {
                "mean": is_mean,
                "std": is_std,
                "splits": 10,
                "num_samples": self.n,
                "classifier": "domain classifier",
            },
        }
        if utility:
            train_x, train_y = _real_subset(self.train, self.n)
            result["gen2real_acc"] = gen2real(images, labels, real_images, real_labels, self.num_classes)
            result["real2gen_acc"] = real2gen(train_x, train_y, images, labels, self.num_classes)
        for name, (data, publishable) in PROVENANCE.items():
            if isinstance(result.get(name), dict):
                result[name].update(data=data, publishable=publishable)
        return result


def evaluate_run(
    path: str | Path,
    *,
    num_samples: int | None = None,
    fid_samples: int | None = None,
    inception: bool | None = None,
    inception_weights: str | None = None,
    progress: bool = True,
    protocol: str = "quick",
) -> dict[str, Any]:
    """Evaluate the run in ``path``; writes eval.json, plots/ and report.html; returns eval.json.
    ``protocol``: besides the quick figures, DPImageBench's (``evaluate_protocol.py``)."""
    run, cfg = RunDirectory.open_existing(path)
    check_writable(
        run.path, "evaluate writes eval.json, plots/ and report.html there (copy the run somewhere writable)"
    )
    summary = read_run_summary(run)
    ckpt = run.load_checkpoint()
    if "released_generator" not in ckpt:
        raise RunDirectoryError(f"{run.path / 'checkpoint.pt'} holds no released generator")
    evaluator = Evaluator(
        cfg,
        num_samples=num_samples or cfg.eval_samples,
        fid_samples=fid_samples or cfg.eval_fid_samples,
        inception=cfg.eval_inception if inception is None else inception,
        inception_weights=inception_weights if inception_weights is not None else cfg.inception_weights,
        progress=progress,
    )
    gen = load_generator(cfg, ckpt["released_generator"], run.path / "checkpoint.pt")
    result = evaluator.evaluate(gen)
    if protocol != "quick":
        from .evaluate_protocol import evaluate_protocol

        eps = summary["epsilon_max"]
        result["protocol"] = evaluate_protocol(
            evaluator, gen, protocol, epsilon=eps, generate=generate, progress=progress
        )
    result.update(
        _privacy_summary(summary),
        steps_completed=summary["steps_completed"],
        num_classes=num_classes_for(cfg),
        curve=_snapshot_curve(run, cfg, evaluator, summary, result),
    )
    plots = _plots(run, cfg, summary, result)
    run.write_json("eval.json", result)
    add_publishable_eval(run, {k: result[k] for k, (_, public) in PROVENANCE.items() if public and k in result})
    write_report(run.path, result, plots)
    return result


def _privacy_summary(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("accounting", "delta", "epsilon_max", "epsilon_amplified")
    eps = [c["epsilon"] for c in summary["clients"] if c["queries"] > 0 and c["epsilon"] is not None]
    return {"privacy": {**{k: summary.get(k) for k in keys}, "epsilon_median": float(np.median(eps)) if eps else None}}


def _snapshot_curve(
    run: RunDirectory, cfg: ExperimentConfig, evaluator: Evaluator, summary: dict, final: dict
) -> list[dict[str, Any]]:
    """ε vs quality over the run's snapshots (domain FID each; Inception FID only at the end)."""
    points = []
    for path in run.snapshots():
        snap = run.load_snapshot(path)
        try:
            state, step, eps = snap["generator"], snap["step"], snap["privacy"]["epsilon_max"]
        except (KeyError, TypeError) as err:
            raise RunDirectoryError(f"snapshot {path} is corrupt ({type(err).__name__}); delete it or rerun") from err
        gen = load_generator(cfg, state, path)
        images, _ = generate(gen, evaluator.n, num_classes=evaluator.num_classes, z_dim=cfg.z_dim)
        points.append(
            {
                "step": step,
                "epsilon_max": eps,
                "fid_domain": evaluator.fid_domain(images),
                "fid": None,
            }
        )
    if not points or points[-1]["step"] != summary["steps_completed"]:
        points.append(
            {
                "step": summary["steps_completed"],
                "epsilon_max": summary["epsilon_max"],
                "fid_domain": final["fid_domain"]["value"],
                "fid": None,
            }
        )
    points[-1]["fid"] = final["fid"]["value"]
    for p in points:
        p["delta"] = summary["delta"]
    return points


def _plots(run: RunDirectory, cfg: ExperimentConfig, summary: dict, result: dict) -> dict[str, Any]:
    folder = run.path / "plots"
    folder.mkdir(exist_ok=True)
    metrics = run.read_metrics()
    kind = headline_kind(summary)
    plots = {
        "epsilon_per_client": plot_epsilon_per_client(summary, folder / "epsilon_per_client.png"),
        "training_curves": plot_training_curves(
            metrics,
            folder / "training_curves.png",
            delta=cfg.delta,
            beside_kind=BesideFigure.of(summary).kind,
            kind=kind,
        ),
    }
    fid_metrics = ["fid_domain"] + (["fid"] if result["fid"]["value"] is not None else [])
    for metric in fid_metrics:
        plots[f"epsilon_vs_{metric}"] = plot_epsilon_vs_fid(
            result["curve"], folder / f"epsilon_vs_{metric}.png", metric=metric, delta=cfg.delta, kind=kind
        )
    samples = sorted((run.path / "samples").glob("step-*.png"))
    if samples:
        plots["samples"] = samples[-1]
    return plots


METRICS = ("fid", "fid_domain", "inception_score", "gen2real_acc", "real2gen_acc")
# figure -> (the data it was computed from, whether it may be published beside the generator)
PRIVATE_TRAIN = "a classifier trained on the real training split: the clients' own data, un-noised and unaccounted"
PROVENANCE = {
    "fid": ("the public Inception network on held-out test images", True),
    "fid_domain": (f"features of {PRIVATE_TRAIN}", False),
    "inception_score": (PRIVATE_TRAIN, False),
    "gen2real_acc": ("classifiers trained on generated images, tested on held-out test images", True),
    "real2gen_acc": (PRIVATE_TRAIN + ", tested on generated images", False),
}


def print_eval(result: dict[str, Any]) -> None:
    """The evaluation table, then a warning line for each figure that says the generator learned little."""
    print(format_eval_table({k: result[k] for k in METRICS if k in result}), flush=True)
    for line in quality_warnings(result, num_classes=result.get("num_classes")):
        print(line, flush=True)
    if "protocol" in result:
        from .evaluate_protocol import format_protocol

        print(format_protocol(result["protocol"]), flush=True)
