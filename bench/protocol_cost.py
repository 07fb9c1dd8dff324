"""What DPImageBench's protocol costs on this machine, and how far its FID at small N sits from N = 10,000.

Issue 26 asks for the protocol's FID "at the largest N that fits 2 CPU cores in ≤ 15 minutes", with
that N's bias against N = 10,000 measured once. On one finished run's generator this measures:

1. the Inception network's time per image (generated images; the real statistics are computed once
   and cached, so an evaluation pays for the generated N only) and the largest N it allows in 15 min;
2. FID (against the protocol's real training images) at N = 500, 1,000, 2,000, ... up to ``--fid-max``,
   each on the first N of one generated and one real set, and the least-squares fit FID_N = a + b/N
   (FID's bias is O(1/N): Chong & Forsyth 2020), extrapolated to N = 10,000 and ∞;
3. (unless ``--skip-classifiers``) the ``dpimagebench-cpu`` classifiers' accuracy and wall time.

Usage: ``PYTHONPATH=. python bench/protocol_cost.py RUN_DIR [--fid-max 5000] [--skip-classifiers]``;
writes bench/results/protocol-cost.{json,md} and prints one line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGET_S = 15 * 60


def fit_inverse_n(ns: list[int], fids: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares FID_N = a + b / N."""
    design = np.stack([np.ones(len(ns)), 1.0 / np.asarray(ns, float)], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, np.asarray(fids, float), rcond=None)
    return float(a), float(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fid-max", type=int, default=5000)
    parser.add_argument("--skip-classifiers", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)

    from common.evaluation.anchors import protocol_accuracy, recipe
    from common.evaluation.fid import feature_stats, frechet_distance
    from server.reporting import RunDirectory
    from simulations.experiments.evaluate import Evaluator, generate, load_generator
    from simulations.experiments.evaluate_protocol import _as_tensors, protocol_splits

    run, cfg = RunDirectory.open_existing(args.run_dir)
    ev = Evaluator(cfg, num_samples=100, fid_samples=10, inception=True, inception_weights="", progress=False)
    if ev.inception is None:
        raise SystemExit(f"no Inception network: {ev.inception_note}")
    gen = load_generator(cfg, run.load_checkpoint()["released_generator"], run.path / "checkpoint.pt")
    keep, val = protocol_splits(ev.train)
    n_max = min(args.fid_max, len(keep))
    images, labels = generate(gen, 60_000, num_classes=ev.num_classes, z_dim=cfg.z_dim)
    real = _as_tensors(ev.train, np.sort(np.random.default_rng(0).permutation(keep)[:n_max]))[0]

    start = time.perf_counter()
    fake_feats = ev.inception(images[:n_max])
    per_image = (time.perf_counter() - start) / n_max
    real_feats = ev.inception(real)
    ns = [n for n in (500, 1000, 2000, 5000, 10000, 20000) if n < n_max] + [n_max]
    fids = [frechet_distance(feature_stats(real_feats[:n]), feature_stats(fake_feats[:n])) for n in ns]
    a, b = fit_inverse_n(ns, fids)
    n_budget = int(BUDGET_S / per_image)
    result = {
        "benchmark": "protocol-cost",
        "command": "PYTHONPATH=. python bench/protocol_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "run": str(args.run_dir),
        "inception": ev.inception.name,
        "inception_s_per_image": per_image,
        "fid_n_in_15_min": n_budget,
        "fid": [{"n": n, "fid": f, "fit": a + b / n} for n, f in zip(ns, fids, strict=True)],
        "fit": {"a": a, "b": b, "fid_10000": a + b / 10_000, "fid_inf": a},
        "bias_vs_10000": {str(n): f - (a + b / 10_000) for n, f in zip(ns, fids, strict=True)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "protocol-cost.json").write_text(json.dumps(result, indent=2) + "\n")  # the FID part, kept
    if not args.skip_classifiers:
        spec = recipe("dpimagebench-cpu")
        start = time.perf_counter()
        acc = protocol_accuracy(
            (images, labels),
            _as_tensors(ev.train, val),
            _as_tensors(ev.test),
            ev.num_classes,
            spec,
            epsilon=json.loads((run.path / "summary.json").read_text())["epsilon_max"] or math.inf,
            progress=lambda msg: print(msg, flush=True),
        )
        acc.pop("recipe")
        result["classifiers"] = {**acc, "wall_s": time.perf_counter() - start}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "protocol-cost.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "protocol-cost.md").write_text(markdown(result))
    cls = result.get("classifiers")
    print(
        f"protocol-cost: Inception {per_image:.3f} s/image -> N = {n_budget} in 15 min; FID@{n_max} "
        f"{fids[-1]:.1f}, fitted FID@10000 {a + b / 10_000:.1f} (bias {fids[-1] - a - b / 10_000:+.1f})"
        + (f"; dpimagebench-cpu {cls['mean']:.1%} in {cls['wall_s']:.0f} s" if cls else "")
    )
    return 0


def markdown(r: dict) -> str:
    lines = [
        f"Command: `{r['command']}` (run `{r['run']}`)",
        "",
        f"Inception ({r['inception']}): {r['inception_s_per_image']:.3f} s per generated image on this machine, "
        f"so N = {r['fid_n_in_15_min']:,} fits 15 minutes (the real statistics are computed once and cached).",
        "",
        "| N | FID (measured) | a + b/N fit | bias vs fitted N = 10,000 |",
        "|---|---|---|---|",
    ]
    for p in r["fid"]:
        lines.append(f"| {p['n']:,} | {p['fid']:.1f} | {p['fit']:.1f} | {r['bias_vs_10000'][str(p['n'])]:+.1f} |")
    f = r["fit"]
    lines += [
        "",
        f"Fit FID_N = {f['a']:.1f} + {f['b']:.0f}/N: FID at N = 10,000 ≈ {f['fid_10000']:.1f}, at ∞ ≈ {f['a']:.1f}.",
    ]
    if "classifiers" in r:
        c = r["classifiers"]
        per = ", ".join(f"{k} {v['test_acc']:.1%} (epoch {v['epoch']})" for k, v in c["classifiers"].items())
        lines += [
            "",
            f"dpimagebench-cpu classifiers: mean {c['mean']:.1%} ± {c['std']:.1%} ({per}), noiseless selection "
            f"{c['mean_noiseless_selection']:.1%}; {c['wall_s']:.0f} s for the three.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
