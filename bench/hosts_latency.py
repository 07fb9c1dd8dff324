"""Step latency of SuperNodes on hosts of their own (network namespaces) against loopback, side by side.

Issue 25's acceptance figure: the same GS-WGAN run through the gRPC data plane on two local TLS +
auth deployments at once, one with each SuperNode in a namespace of its own dialling the server's
bridge address, one on loopback (simulations/deploy/side_by_side.py, the runs the deployment test
checks for peers, bytes and ε). Each repeat starts both deployments afresh; the result is the ratio
of median step latencies per repeat, against issue 25's bound of 1.2x. Needs root and iproute2.
Writes ``bench/results/hosts_latency.json`` and prints one line.

    python bench/hosts_latency.py [--repeats 3] [--steps 60] [--nodes 3] [--model tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulations.deploy import netns  # noqa: E402
from simulations.deploy.side_by_side import latency_ratio, run_side_by_side, short_run  # noqa: E402

BOUND = 1.2  # issue 25: the namespaced deployment's median step within 1.2x of loopback's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh pairs of deployments")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hosts_latency.json")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or not 1 <= args.nodes <= netns.MAX_NODES:
        parser.error(f"--repeats and --steps must be >= 1 and --nodes in [1, {netns.MAX_NODES}]")
    if not netns.available():
        print("hosts_latency: network namespaces need root and iproute2's `ip`; nothing measured", file=sys.stderr)
        return 2
    repeats = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="fedgan-hosts-") as tmp:
            base = Path(tmp)
            pair = run_side_by_side(
                base, args.nodes, lambda n, b=base: short_run(b, n, args.nodes, args.steps, args.model)
            )
            # the 1-minute load average at the pair's end: the ratio's context on a shared machine
            repeats.append({**latency_ratio(pair), "loadavg_1m": os.getloadavg()[0]})
    ratios = [r["ratio"] for r in repeats]
    loads = "/".join(f"{r['loadavg_1m']:.1f}" for r in repeats)
    result = {
        "benchmark": "hosts_latency",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "repeats": repeats,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "bound": BOUND,
        "within_bound": max(ratios) <= BOUND,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"namespaces / loopback median step latency over {args.repeats} side-by-side pairs, {args.steps} steps: "
        f"median {result['ratio_median']:.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}; issue 25's bound "
        f"{BOUND}x: {'within' if result['within_bound'] else 'EXCEEDED'}; load {loads}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
