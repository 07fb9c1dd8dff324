"""How fast the ``dpimagebench-cpu`` classifiers train here, in PyTorch's two memory layouts.

Issue 26 wants the anchors' protocol for every method at three ε; on 2 CPU cores one evaluation costs
~80 minutes, most of it the three classifiers' training. oneDNN's convolutions usually run faster
channels-last (NHWC) than in PyTorch's default NCHW on a CPU, and the layout changes no arithmetic
that matters (the same convolution, another loop order). This measures, per network of the recipe,
training steps of batch 256 (Adam, the recipe's lr) in both layouts, interleaved round by round so a
noisy machine hurts both alike, and checks that the two layouts give the same logits from the same
weights.

Usage: ``PYTHONPATH=. python bench/protocol_speed.py [--steps 20] [--rounds 3]``; writes
bench/results/protocol-speed.json and prints one line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_seconds(model, x, y, steps: int, *, channels_last: bool, lr: float) -> float:
    """Seconds per training step of ``model`` on the batch (x, y), median of ``steps`` after one warm-up."""
    import torch
    import torch.nn.functional as F

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt).train()
    x = x.contiguous(memory_format=fmt)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per layout and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (NCHW, NHWC, NCHW, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the protocol runs with 1)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "protocol-speed.json")
    args = parser.parse_args(argv)
    import torch

    from common.evaluation.anchors import recipe

    torch.set_num_threads(args.threads)
    spec = recipe("dpimagebench-cpu")
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(spec.batch_size, 1, 28, 28, generator=gen) * 2 - 1
    y = torch.randint(0, 10, (spec.batch_size,), generator=gen)
    rows = {}
    for name, factory in spec.networks(10).items():
        torch.manual_seed(0)
        base = factory()
        with torch.no_grad():  # the same weights in both layouts give the same logits
            a = copy.deepcopy(base).eval()(x)
            b = (
                copy.deepcopy(base)
                .to(memory_format=torch.channels_last)
                .eval()(x.contiguous(memory_format=torch.channels_last))
            )
        per = {"nchw": [], "channels_last": []}
        for _ in range(args.rounds):
            for layout in per:
                model = copy.deepcopy(base)
                per[layout].append(step_seconds(model, x, y, args.steps, channels_last=layout != "nchw", lr=spec.lr))
        nchw, nhwc = statistics.median(per["nchw"]), statistics.median(per["channels_last"])
        rows[name] = {
            "nchw_s_per_step": nchw,
            "channels_last_s_per_step": nhwc,
            "speedup": nchw / nhwc,
            "max_abs_logit_diff": float((a - b).abs().max()),
            "rounds": per,
        }
    total_nchw = sum(r["nchw_s_per_step"] for r in rows.values())
    total_nhwc = sum(r["channels_last_s_per_step"] for r in rows.values())
    result = {
        "benchmark": "protocol-speed",
        "command": "PYTHONPATH=. python bench/protocol_speed.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "threads": args.threads,
        "batch": spec.batch_size,
        "networks": rows,
        "all_three_speedup": total_nchw / total_nhwc,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    per_net = ", ".join(f"{k} {v['speedup']:.2f}x" for k, v in rows.items())
    print(
        f"protocol-speed: channels-last vs NCHW, training step of batch {spec.batch_size}: {per_net}; "
        f"all three {result['all_three_speedup']:.2f}x -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
