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
  images (``--screen-n``) for 2 epochs, tested on the real test split (the full protocol: ``fedgan evaluate RUN
  --protocol dpimagebench-cpu``);
- optionally ``--noise STD``: Gaussian noise of that std added to every coordinate of the target;
- optionally ``--protocol dpimagebench-cpu`` (or ``dpimagebench``): the whole protocol on the
  generator (its 60,000 images, the three classifiers, selection at ε = ∞ on the validation split),
  as ``fedgan evaluate`` runs it, without its FID.

``--protocol-holdout`` among the simulate flags embeds only the images outside the protocol's
validation split, as a run with that flag does. ``--device cuda`` embeds, fits and trains the
protocol's classifiers there (the quick CNN / MLP stay on the CPU, as in a run).

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


def fit_and_score(cfg, *, noise: float, protocol=None, screen_n: int = 20_000, eval_n: int = 10_000) -> dict:
    """The pooled summary, the generator fitted to it, and its scores (``protocol``: a ``Recipe`` to
    run in full as well)."""
    import torch

    from common.data import load_dataset
    from common.device import resolve_device
    from common.evaluation.anchors import RECIPES, protocol_accuracy, train_and_select
    from common.evaluation.utility import train_eval
    from common.methods import method
    from common.methods.dp_merf.features import embed
    from common.methods.dp_merf.generator import MerfGenerator
    from simulations.experiments.evaluate import generate
    from simulations.experiments.evaluate_protocol import _as_tensors, protocol_splits

    family = method(cfg.strategy).family
    train, test = load_dataset(cfg.dataset, split="train"), load_dataset(cfg.dataset, split="test")
    device = resolve_device(cfg.device)
    keep, val = protocol_splits(train)
    x, y = _as_tensors(train, keep if cfg.protocol_holdout else None)
    start = time.perf_counter()
    target = embed(family.build(cfg, device), x.to(device), y.to(device), train.num_classes, chunk=2000).cpu()
    if noise:
        target = target + noise * torch.randn(target.shape, generator=torch.Generator().manual_seed(7))
    g = MerfGenerator(cfg, train.num_classes, family)
    g.set_mean(target, 1)
    for _ in range(cfg.steps):
        g.step()
    fit_s = time.perf_counter() - start
    gen = g.ema.module.eval()
    wanted = max(eval_n, screen_n, protocol.synthetic_size if protocol else 0)
    images, labels = generate(gen, wanted, num_classes=train.num_classes, z_dim=cfg.z_dim)
    images, labels = images.cpu(), labels.cpu()
    tx, ty = _as_tensors(test)
    validation = _as_tensors(train, val)
    quick = {
        arch: train_eval(arch, images[:eval_n], labels[:eval_n], tx, ty, train.num_classes, epochs=5)
        for arch in ("cnn", "mlp")
    }
    spec = dataclasses.replace(RECIPES["dpimagebench-cpu"], epochs=2, step_epochs=2)
    screen = train_and_select(
        spec.networks(train.num_classes)["resnet"],
        (images[:screen_n], labels[:screen_n]),
        validation,
        (tx, ty),
        spec,
        epsilon=float("inf"),
        seed=0,
        device=device,
    )
    row = {"cnn_10k": quick["cnn"], "mlp_10k": quick["mlp"], "resnet8_screen": screen["test_acc"], "fit_s": fit_s}
    if protocol is not None:
        start = time.perf_counter()
        n = protocol.synthetic_size
        full = protocol_accuracy(
            (images[:n], labels[:n]),
            validation,
            (tx, ty),
            train.num_classes,
            protocol,
            epsilon=float("inf"),
            seed=0,
            device=device,
        )
        row["protocol"] = {
            "name": protocol.name,
            "mean": full["mean"],
            "std": full["std"],
            "per_network": {k: v["test_acc"] for k, v in full["classifiers"].items()},
            "wall_s": time.perf_counter() - start,
        }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="dp-merf", help="a one-shot method: dp-merf or dp-ntk")
    parser.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on the target")
    parser.add_argument(
        "--protocol",
        default="",
        choices=("", "dpimagebench-cpu", "dpimagebench"),
        help="also the whole protocol on the fitted generator (no FID)",
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda: the embedding, the fit and the protocol's classifiers"
    )
    parser.add_argument("--screen-n", type=int, default=20_000, help="generated images the ResNet-8 screen trains on")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the quick classifiers run on the CPU)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "one-shot-ceiling.jsonl")
    parser.add_argument("flags", nargs="*", help="simulate flags after --, e.g. --merf-features 3000")
    args = parser.parse_args(argv)
    import torch

    from common.evaluation.anchors import recipe
    from common.methods import ExperimentConfig
    from simulations.cli import add_config_flags

    torch.set_num_threads(args.threads)
    flags = argparse.ArgumentParser()
    add_config_flags(flags)
    base = ["--strategy", args.strategy, "--dataset", "fashion-mnist", "--model", "small", "--steps", "400"]
    cfg = ExperimentConfig(
        **vars(flags.parse_args([*base, "--ema-decay", "0.99", "--device", args.device, *args.flags]))
    )
    spec = recipe(args.protocol) if args.protocol else None
    scores = fit_and_score(cfg, noise=args.noise, protocol=spec, screen_n=args.screen_n)
    row = {"strategy": args.strategy, "flags": args.flags, "noise": args.noise, "device": args.device, **scores}
    row["screen_n"] = args.screen_n
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(
        f"one-shot ceiling {args.strategy} {' '.join(args.flags)}: quick CNN {row['cnn_10k']:.1%} / MLP "
        f"{row['mlp_10k']:.1%}, ResNet-8 screen {row['resnet8_screen']:.1%}"
        + (f", {spec.name} {row['protocol']['mean']:.1%} ± {row['protocol']['std']:.1%}" if spec else "")
        + f" -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
