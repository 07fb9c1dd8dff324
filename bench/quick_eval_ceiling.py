"""The ceiling of the quick evaluation's gen2real: the same classifiers trained on *real* images.

gen2real trains the quick evaluation's CNN and MLP (3 epochs, Adam 1e-3, batch 128) on N generated
images and tests them on N real test images; a generator can at best match real training images of
the same number. This trains those classifiers on N real training images (the seeded subset the
evaluation's real2gen uses) and tests them the same way, for each N, so a gen2real figure can be read
against what N real images would give (issue 26: the frontier's noiseless 62–67% were read as the
generators' ceiling; at N = 2,000 they sit at the evaluation's own).

Usage: ``PYTHONPATH=. python bench/quick_eval_ceiling.py [--dataset fashion-mnist] [--ns 2000,10000]``;
writes bench/results/quick-eval-ceiling-<dataset>.json and prints one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def ceiling(dataset: str, n: int, *, epochs: int = 3, seed: int = 0) -> dict[str, float]:
    """CNN and MLP accuracy on the first ``n`` real test images after training on ``n`` real training images."""
    from common.data import load_dataset
    from common.evaluation.utility import gen2real
    from simulations.experiments.evaluate import _real_subset

    train, test = load_dataset(dataset, split="train"), load_dataset(dataset, split="test")
    train_x, train_y = _real_subset(train, n)
    test_x, test_y = _real_subset(test, n)
    return gen2real(train_x, train_y, test_x, test_y, train.num_classes, epochs=epochs, seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--ns", default="2000,10000", help="comma-separated N (training and test images)")
    parser.add_argument("--epochs", type=int, default=3, help="the quick evaluation's 3")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.ns.split(",")):
        start = time.perf_counter()
        acc = ceiling(args.dataset, n, epochs=args.epochs)
        rows.append({"n": n, "cnn": acc["cnn"], "mlp": acc["mlp"], "wall_s": time.perf_counter() - start})
    result = {
        "dataset": args.dataset,
        "epochs": args.epochs,
        "what": "real2real under the quick evaluation",
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"quick-eval-ceiling-{args.dataset}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    line = "; ".join(f"N {r['n']:,}: CNN {r['cnn']:.1%}, MLP {r['mlp']:.1%}" for r in rows)
    print(f"quick-eval ceiling ({args.dataset}, real images, {args.epochs} epochs): {line} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
