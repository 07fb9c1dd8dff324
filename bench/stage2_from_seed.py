"""Stage 2 of a seeded run again, under other settings, from the same completed seed stage.

Why: a seeded GS-WGAN run on Fashion-MNIST spends ~20 minutes of these cores on its seed stage
(DP-MERF's release and the server's 4,000-step fit) and a few on stage 2. To ask what stage 2 can
add at all (issue 42: without noise, with warmed clients, with another anchor weight), the seed need
not be paid again: this copies a finished run's ``seed/`` and ``seed_start.pt`` into a new run
directory whose ``config.json`` is the old one with ``--set`` changes, then resumes it, which runs
stage 2 only (``server/seeded.py``: a completed seed stage is not run again).

What it is not: a way to spend a seed twice. The new run's clients start with empty node state
(their ledgers hold no stage-1 release), so its per-client ε counts the seed through the copied
privacy.json (``seed_prior``) but its nodes' budget checks do not; it is an experiment on utility.
Its noiseless settings (``noise_multiplier=0``) need ``secure_aggregation=false`` (a secure sum needs
noise shares) and a node policy that allows non-private releases (``--node-policy``).

    PYTHONPATH=. python bench/stage2_from_seed.py --from RUN --out DIR \
        --set noise_multiplier=0 --set secure_aggregation=false --set init_weight=10 \
        [--node-policy policy.toml]

Values of ``--set`` are JSON (``10``, ``false``, ``"query"``). The run's summary and quick
evaluation are what ``fedgan simulate`` prints; its seed alone is ``fedgan evaluate RUN/seed``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.methods import ExperimentConfig  # noqa: E402
from common.methods.seeding import seeded  # noqa: E402
from common.options import ConfigError  # noqa: E402
from server.reporting import RunDirectory, RunDirectoryError  # noqa: E402
from server.seeded import SEED_DIR, START_FILE, completed_summary  # noqa: E402
from simulations.cli import main as fedgan  # noqa: E402


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs, each value JSON; an error names the pair that is not."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value")
        try:
            changes[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"--set {item!r}: the value is not JSON ({err})") from err
    return changes


def clone(source: Path, out: Path, changes: dict[str, Any]) -> ExperimentConfig:
    """A new run directory at ``out``: ``source``'s config with ``changes``, its completed seed stage
    and the start derived from it."""
    _, old = RunDirectory.open_existing(source)
    if not seeded(old):
        raise ValueError(f"{source} is not a seeded run (--init-release none)")
    if completed_summary(RunDirectory(source / SEED_DIR)) is None:
        raise ValueError(f"{source}: its seed stage did not complete")
    cfg = ExperimentConfig.from_mapping({**old.to_dict(), **changes, "out": str(out)}, source="--set")
    RunDirectory.create(cfg)  # refuses an existing --out
    shutil.copytree(source / SEED_DIR, out / SEED_DIR)
    if (source / START_FILE).is_file():
        shutil.copy2(source / START_FILE, out / START_FILE)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, required=True, help="a finished seeded run directory")
    parser.add_argument("--out", type=Path, required=True, help="the new run directory (must not exist)")
    parser.add_argument("--set", action="append", default=[], help="key=value (JSON) to change; repeatable")
    parser.add_argument("--node-policy", default="", help="passed to fedgan simulate")
    parser.add_argument("--transport", choices=("flower", "inprocess"), default="flower", help="as fedgan simulate's")
    args = parser.parse_args(argv)
    try:
        clone(args.source, args.out, parse_sets(args.set))
    except (ConfigError, RunDirectoryError, ValueError) as err:
        print(f"stage2_from_seed: error: {err}", file=sys.stderr)
        return 2
    command = ["simulate", "--resume", str(args.out), "--transport", args.transport]
    return fedgan([*command, "--node-policy", args.node_policy] if args.node_policy else command)


if __name__ == "__main__":
    raise SystemExit(main())
