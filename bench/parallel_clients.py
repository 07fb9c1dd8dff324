"""GS-WGAN step time with m clients per step in Flower's simulation, one actor vs. ``--parallel-clients``.

With m > 1 clients per generator step, the m clients' critic steps and answers are independent; Flower's
simulation runs them one after the other when one ClientApp actor holds every core (the default), or
side by side with ``parallel_clients = N`` actors of cores/N threads each. This benchmark runs the same
configuration (small model, B 32, n_critic 5, critic fakes = query, ``--clients`` K, no warm start) for
each m in ``--m`` with parallel 1 and parallel N, alternating the arms so machine noise hits both, and
reports the steady-state time per step (between the first and the last metrics line, so Ray's start-up
and first-call costs are left out). Writes ``bench/results/parallel_clients.json`` and prints one line.

    python bench/parallel_clients.py [--m 1 2 4] [--parallel 2] [--steps 60] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_overhead import one_arm  # noqa: E402
from common.methods import ExperimentConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4], help="clients per step to measure")
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="actors of the parallel arm")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", type=int, default=20, help="federation size K")
    args = parser.parse_args()
    base = ExperimentConfig(
        steps=args.steps,
        model="small",
        num_clients=args.clients,
        critic_fakes="query",
        progress=False,
        log_every=10,
        sample_every=10**6,
        checkpoint_every=10**6,
        eval=False,
    )
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for m in args.m:
            for parallel in (1, args.parallel):
                cfg = base.replace(clients_per_step=m, parallel_clients=parallel)
                runs.setdefault(f"m{m}-p{parallel}", []).append(one_arm("flower", cfg))
    median = {arm: statistics.median(r["steady_step_s"] for r in rs) for arm, rs in runs.items()}
    speedup = {f"m{m}": median[f"m{m}-p1"] / median[f"m{m}-p{args.parallel}"] for m in args.m}
    out = {
        "config": base.to_dict(),
        "cpus": os.cpu_count(),
        "parallel": args.parallel,
        "runs": runs,
        "median_steady_step_s": median,
        "speedup_parallel_over_one_actor": speedup,
    }
    path = ROOT / "bench" / "results" / "parallel_clients.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    parts = [
        f"m={m}: {median[f'm{m}-p1'] * 1e3:.0f} ms one actor, {median[f'm{m}-p{args.parallel}'] * 1e3:.0f} ms "
        f"{args.parallel} actors ({speedup[f'm{m}']:.2f}x)"
        for m in args.m
    ]
    print(f"parallel_clients: {'; '.join(parts)} per step -> {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
