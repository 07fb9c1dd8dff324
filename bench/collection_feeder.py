"""A collection from every client on Flower's simulation: the feeder's timed-out polls asking every
node (Flower's pass) vs only the nodes with an undelivered message (``flower_tuning._undelivered``).

While a chunk of 128 messages is in flight, each 0.1 s poll of the runtime's feeder that found no
push asked all K nodes, and Flower's in-memory store validates every stored message for each node
asked: K·M checks per poll. The arm ``all`` puts that pass back (``_undelivered`` answering None,
as for a store that cannot say); ``undelivered`` is what runs. Both run DP-MERF's one release from
each of ``make run``'s 1,000 writers through one secure sum (its seed stage's release, pixel
features), then ``--steps`` generator steps, in a fresh process each, the arms alternating (A, B, A,
B). The figure is the loop's wall time (summary.json's ``wall_s``). Writes
``bench/results/collection_feeder.json`` and prints one line.

    python bench/collection_feeder.py [--repeats 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("all", "undelivered")
FLAGS = [
    "--config",
    "simulations/configs/quickstart.toml",
    "--strategy",
    "dp-merf",
    "--init-release",
    "none",
    "--target-epsilon",
    "8",
    "--merf-dct",
    "0",
    "--merf-features",
    "1000",
    "--merf-lengthscale",
    "5",
    "--secagg-cohort",
    "1000",
    "--no-progress",
    "--no-eval",
]
# The child: the arm's feeder, then the CLI in this process (the feeder runs in Flower's server thread).
CHILD = """
import sys
from simulations.experiments import flower_tuning
if sys.argv[1] == "all":
    flower_tuning._undelivered = lambda state: (lambda: None)
from simulations.cli import main
raise SystemExit(main(["simulate", *sys.argv[2:]]))
"""


def run_arm(arm: str, steps: int, out: Path) -> float:
    """One run of ``arm`` into ``out``; the loop's wall seconds."""
    cmd = [sys.executable, "-c", CHILD, arm, *FLAGS, "--steps", str(steps), "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(json.loads((out / "summary.json").read_text())["wall_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "collection_feeder.json")
    args = parser.parse_args(argv)
    walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                walls[arm].append(run_arm(arm, args.steps, Path(tmp) / f"{arm}-{r}"))
    medians = {arm: statistics.median(w) for arm, w in walls.items()}
    result = {
        "benchmark": "collection_feeder",
        "clients": 1000,
        "steps": args.steps,
        "wall_s": walls,
        "median_wall_s": medians,
        "speedup": medians["all"] / medians["undelivered"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"collection_feeder: 1,000 clients' secure collection on Flower's simulation, loop wall "
        f"{medians['all']:.1f} s with full polls vs {medians['undelivered']:.1f} s with undelivered-node polls "
        f"({result['speedup']:.2f}x) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
