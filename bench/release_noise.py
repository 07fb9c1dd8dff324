"""The noise a one-shot run's released mean carried, measured: the run's target against the pooled
mean embedding of the same training images, beside what the secure sum's calibration predicts.

Why: the noise on the mean a DP-MERF generator fits is what decides its utility at small ε, and it is
not σ·2S/K. Through secure sums each client adds a Skellam share of std 2S·σ/√t (t: its cohort's
threshold), so the mean of K summaries carries std 2Sσ/√(K·t) per coordinate: with cohorts of c
(t ≈ 2c/3) that is √(K/t) releases' worth of noise, and only a larger federation *and* a larger cohort
lower it. The pooled mean is the signal (the clients' clipping makes it a slightly biased reference,
so the measured noise is an upper bound on the mechanism's). Reads only the operator's run directory
(its checkpoint and summary are never published); writes one JSON row, prints a one-line summary.

    PYTHONPATH=. python bench/release_noise.py RUN_DIR [--seed-stage] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def target_of(checkpoint: dict):
    """The fitted target (the released mean) in a DP-MERF checkpoint, wherever the strategy keeps it."""
    generator = checkpoint.get("strategy", {}).get("generator", {})
    if "target" not in generator or generator["target"] is None:
        raise SystemExit("release_noise: the checkpoint holds no released mean (not a one-shot run, or not collected)")
    return generator["target"].float()


def predicted_std(summary: dict) -> float:
    """Per-coordinate std of the noise on the mean of K releases, from the multiplier each client's
    noise carried as the run recorded it: 2S·share/√K (the share σ/√(t − k) through secure sums, σ in
    the clear)."""
    mechanism = summary.get("mechanism", {})
    S, K = float(mechanism["S"]), int(mechanism.get("releases used", 0))
    secure = summary.get("method", {}).get(summary.get("strategy", ""), {}).get("secure_aggregation", {})
    share = float(secure.get("noise_multiplier_share", mechanism["σ"]))
    return 2 * S * share / math.sqrt(K) if K else float("nan")


def measure(run: Path) -> dict:
    import torch

    from common.data import load_dataset
    from common.methods import ExperimentConfig, method
    from common.methods.dp_merf.features import embed
    from simulations.experiments.evaluate_protocol import _as_tensors, protocol_splits

    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    config = json.loads((run / "config.json").read_text())
    cfg = ExperimentConfig(**{k: v for k, v in config.items() if k in fields})
    summary = json.loads((run / "summary.json").read_text())
    target = target_of(torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False))
    train = load_dataset(cfg.dataset, cfg.data_dir, split="train")
    x, y = _as_tensors(train, protocol_splits(train)[0] if cfg.protocol_holdout else None)
    pooled = embed(method(cfg.strategy).family.build(cfg, "cpu"), x, y, train.num_classes, chunk=2000)
    noise = target - pooled
    mechanism = summary.get("mechanism", {})
    return {
        "run": str(run),
        "num_clients": summary.get("num_clients"),
        "mechanism": mechanism,
        "coordinates": int(noise.numel()),
        "signal_norm": float(pooled.norm()),
        "noise_norm": float(noise.norm()),
        "noise_std": float(noise.std()),
        "predicted_std": predicted_std(summary),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a dp-merf run directory (or a seeded run's seed/ with --seed-stage)")
    parser.add_argument("--seed-stage", action="store_true", help="RUN is a seeded run: measure its seed/ stage")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "release-noise.jsonl")
    args = parser.parse_args(argv)
    run = args.run / "seed" if args.seed_stage else args.run
    for name in ("config.json", "summary.json", "checkpoint.pt"):
        if not (run / name).is_file():
            raise SystemExit(f"release_noise: {run / name} not found (a finished one-shot run directory is needed)")
    row = measure(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(
        f"release noise {run}: K {row['num_clients']}, noise norm {row['noise_norm']:.3f} against a mean of "
        f"norm {row['signal_norm']:.3f} (std {row['noise_std']:.2e} per coordinate, predicted "
        f"{row['predicted_std']:.2e}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
