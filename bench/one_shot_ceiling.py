"""A one-shot method's ceiling on one machine: its generator fitted to the pooled data's summary.

Issue 26 asks what limits the one-shot releases without noise. With every example in one summary
and σ = 0 (what a federation of K clients approaches at large K, and the ∞ point of the frontier
without its K round trips), this embeds the whole training split with the method's own feature map
(``FeatureFamily``: DP-MERF's random Fourier features or DP-NTK's tangent features), fits the
server's generator (``MerfGenerator``, the same code and options as a run) for ``--steps`` steps,
and scores the released EMA generator three ways:

- the quick evaluation's CNN and MLP trained on 10,000 generated images (5 epochs), tested on the
  10,000 real test images (their ceiling on real images: ``bench/quick_eval_ceiling.py``);
- a screen of the anchors' protocol: the ``dpimagebench-cpu`` ResNet-8 trained on 20,000 generated
  images for 2 epochs, tested on the real test split (the full protocol: ``fedgan evaluate RUN
  --protocol dpimagebench-cpu``);
- optionally ``--noise STD``: Gaussian noise of that std added to every coordinate of the target.

Usage: ``PYTHONPATH=. python bench/one_shot_ceiling.py --strategy dp-merf -- --merf-dct 0 --merf-features 3000``
(any simulate flags after ``--``); appends a JSON line to bench/results/one-shot-ceiling.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fit_and_score(cfg, *, noise: float, screen_n: int = 20_000, eval_n: int = 10_000) -> dict:
    """The pooled summary, the generator fitted to it, and its three scores."""
    import torch

    from common.data import load_dataset
    from common.evaluation.anchors import RECIPES, train_and_select
    from common.evaluation.utility import train_eval
    from common.methods import method
    from common.methods.dp_merf.features import embed
    from common.methods.dp_merf.generator import MerfGenerator
    from simulations.experiments.evaluate import generate
    from simulations.experiments.evaluate_protocol import _as_tensors, protocol_splits

    family = method(cfg.strategy).family
    train, test = load_dataset(cfg.dataset, split="train"), load_dataset(cfg.dataset, split="test")
    x, y = _as_tensors(train)
    start = time.perf_counter()
    target = embed(family.build(cfg, "cpu"), x, y, train.num_classes, chunk=2000)
    if noise:
        target = target + noise * torch.randn(target.shape, generator=torch.Generator().manual_seed(7))
    g = MerfGenerator(cfg, train.num_classes, family)
    g.set_mean(target, 1)
    for _ in range(cfg.steps):
        g.step()
    fit_s = time.perf_counter() - start
    gen = g.ema.module.eval()
    images, labels = generate(gen, max(eval_n, screen_n), num_classes=train.num_classes, z_dim=cfg.z_dim)
    tx, ty = _as_tensors(test)
    quick = {
        arch: train_eval(arch, images[:eval_n], labels[:eval_n], tx, ty, train.num_classes, epochs=5)
        for arch in ("cnn", "mlp")
    }
    _, val = protocol_splits(train)
    spec = dataclasses.replace(RECIPES["dpimagebench-cpu"], epochs=2, step_epochs=2)
    screen = train_and_select(
        spec.networks(train.num_classes)["resnet"],
        (images[:screen_n], labels[:screen_n]),
        _as_tensors(train, val),
        (tx, ty),
        spec,
        epsilon=float("inf"),
        seed=0,
        device=torch.device("cpu"),
    )
    return {"cnn_10k": quick["cnn"], "mlp_10k": quick["mlp"], "resnet8_screen": screen["test_acc"], "fit_s": fit_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="dp-merf", help="a one-shot method: dp-merf or dp-ntk")
    parser.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on the target")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "one-shot-ceiling.jsonl")
    parser.add_argument("flags", nargs="*", help="simulate flags after --, e.g. --merf-features 3000")
    args = parser.parse_args(argv)
    import torch

    from common.methods import ExperimentConfig
    from simulations.cli import add_config_flags

    torch.set_num_threads(1)
    flags = argparse.ArgumentParser()
    add_config_flags(flags)
    base = ["--strategy", args.strategy, "--dataset", "fashion-mnist", "--model", "small", "--steps", "400"]
    cfg = ExperimentConfig(**vars(flags.parse_args([*base, "--ema-decay", "0.99", *args.flags])))
    row = {"strategy": args.strategy, "flags": args.flags, "noise": args.noise, **fit_and_score(cfg, noise=args.noise)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(
        f"one-shot ceiling {args.strategy} {' '.join(args.flags)}: quick CNN {row['cnn_10k']:.1%} / MLP "
        f"{row['mlp_10k']:.1%}, ResNet-8 screen {row['resnet8_screen']:.1%} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
