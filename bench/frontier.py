"""The privacy–utility frontier: every strategy at target ε ∈ {1, 10, 100, ∞}, evaluated one way.

Each point: one ``fedgan simulate`` run (in-process) on the same data, at ``--target-epsilon`` in its own unit:

- gswgan: per-client ε against an untrusted server (what a client's own ledger guarantees);
- dpgan: example-level ε of the pooled data set (a trusted curator holds every example);
- fedavg-gan: user-level ε with a trusted server (DP-FedAvg; each client's raw delta reaches it);
- dp-merf: per-client ε against an untrusted server (one noisy summary per client);
- dp-ntk: the same, with DP-NTK's tangent features instead of random Fourier features.

∞ is the same run without noise (``--noise-multiplier 0`` and the like, allowed by a node policy
that permits non-private options). Every run is evaluated by its own end-of-run evaluation: the
Inception FID at ``--fid-samples`` (TF-FID weights), the domain FID and Inception Score on the
project classifier, gen2real and real2gen (CNN and MLP). Each point's ε is then **recomputed**
from the ledgers in its privacy.json (``PrivacyLedger`` from the recorded events, and dp-accounting
where it is installed) and must match the ε the run printed; a mismatch stops the benchmark.

    python bench/frontier.py [--scale cpu] [--dataset fashion-mnist] [--jobs 2] [--only gswgan]

Writes ``bench/results/frontier-<dataset>-<scale>.{json,md,png}`` (the table: ``frontier_report.py``),
one line per point and a summary line. ``--scale cpu``: this project's 2-core machine (small model,
≤ 1 h in all); ``--scale paper``: GS-WGAN's networks and step counts for a GPU (``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frontier_epsilon import (  # noqa: E402  (bench/ is the script's folder)
    SECURE_UNIT,
    dp_accounting_epsilon,
    recomputed_epsilon,
    reported_epsilon,
)
from frontier_protocol import protocol_figures  # noqa: E402
from frontier_report import PUBLISHED, markdown  # noqa: E402
from frontier_settings import LEVERS, NO_NOISE, SCALES, UNITS, VARIANTS  # noqa: E402

from common.evaluation.frontier_plot import plot_frontier  # noqa: E402


def variant_indices(spec: str) -> list[int]:
    """``--variants``: all, none, or comma-separated indices into ``VARIANTS``."""
    if spec == "all":
        return list(range(len(VARIANTS)))
    if spec in ("none", ""):
        return []
    chosen = [int(i) for i in spec.split(",")]
    if any(not 0 <= i < len(VARIANTS) for i in chosen):
        raise SystemExit(f"--variants: indices must lie in [0, {len(VARIANTS)})")
    return chosen


def lever_flags(scale: str, upto: int) -> list[str]:
    """The flags of the first ``upto`` + 1 levers (cumulative)."""
    return [flag for _, flags in LEVERS[scale][: upto + 1] for flag in flags]


def run_flags(
    scale: str,
    strategy: str,
    target: float,
    args: argparse.Namespace,
    out: Path,
    lever: int | None = None,
    variant: int | None = None,
) -> list[str]:
    flags = ["simulate", "--transport", "inprocess", "--strategy", strategy, "--dataset", args.dataset]
    flags += SCALES[scale]["common"] + SCALES[scale][strategy]
    flags += ["--device", args.device, "--eval-fid-samples", str(args.fid_samples), "--no-progress", "--out", str(out)]
    if not args.inception:
        flags.append("--no-eval-inception")
    flags += NO_NOISE[strategy] if math.isinf(target) else ["--target-epsilon", f"{target:g}"]
    if strategy == "gswgan":  # the main rows carry every lever; a lever row stops after its own
        flags += lever_flags(scale, len(LEVERS[scale]) - 1 if lever is None else lever)
    if variant is not None:
        flags += VARIANTS[variant][2]
    flags += args.extra
    return flags + node_policy(strategy, target, flags, args.work)


def node_policy(strategy: str, target: float, flags: list[str], work: Path) -> list[str]:
    """``--node-policy`` for a point whose nodes would refuse it under the default policy: an ∞ point
    sends releases without noise (allow-nonprivate), and Fed-Avg without secure sums sends raw deltas
    for the server to noise (trust-server; the unit its rows carry, "trusted server", says so)."""
    keys = ["allow-nonprivate"] * math.isinf(target)
    keys += ["trust-server"] * (strategy == "fedavg-gan" and "--secure-aggregation" not in flags)
    if not keys:
        return []
    path = work / f"policy-{'-'.join(keys)}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} = true\n" for k in keys))
    return ["--node-policy", str(path)]


def one_point(
    scale: str,
    strategy: str,
    target: float,
    args: argparse.Namespace,
    lever: int | None = None,
    variant: int | None = None,
) -> dict[str, Any]:
    name = f"{strategy}-eps{target:g}" + ("" if lever is None else f"-lever{lever}")
    name += "" if variant is None else f"-variant{variant}"
    label = {} if variant is None else {"variant": VARIANTS[variant][1]}
    out = args.work / name
    finished = out.exists() and (out / "eval.json").exists() and (args.reuse or args.collect_only)
    if not finished and args.collect_only:
        name = None if lever is None else LEVERS[scale][lever][0]
        return {"strategy": strategy, "target": target, "lever": name, **label, "error": "not run (--collect-only)"}
    if not finished:
        if out.exists():
            subprocess.run(["rm", "-rf", str(out)], check=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGAN_CLIENT_THREADS": "1"}
        cmd = [sys.executable, "-m", "simulations.cli", *run_flags(scale, strategy, target, args, out, lever, variant)]
        log = args.work / f"{name}.log"
        args.work.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh:
            code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        if code != 0:
            name = None if lever is None else LEVERS[scale][lever][0]
            return {"strategy": strategy, "target": target, "lever": name, **label, "error": f"exit {code}, see {log}"}
    point = point_from_run(strategy, target, out)
    if args.protocol != "quick":
        point.update(protocol_figures(out, args.protocol, evaluate=not args.collect_only))
    if lever is not None:
        point["lever"] = LEVERS[scale][lever][0]
    return {**point, **label}


def point_key(point: dict[str, Any]) -> tuple[str, float, str | None, str | None]:
    """What names one cell of the frontier: a strategy at a target, maybe as a lever or a variant."""
    return (point["strategy"], float(point["target"]), point.get("lever"), point.get("variant"))


def merge_points(before: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points already tabulated, each replaced by this invocation's point for the same cell.

    Per cell, not per strategy: adding one method's ∞ to a table that holds its ε 1 and 10 keeps them,
    even when their run directories are gone. A cell this invocation only reports as not run
    (`--collect-only` over a work folder without it) never overwrites a measured one."""
    fresh = {point_key(r): r for r in rows}
    kept = [
        old
        for old in before
        if point_key(old) not in fresh or ("error" in fresh[point_key(old)] and "error" not in old)
    ]
    kept_keys = {point_key(r) for r in kept}
    merged = kept + [r for key, r in fresh.items() if key not in kept_keys]
    order = list(dict.fromkeys(r["strategy"] for r in merged))
    plain = [r for r in merged if r.get("lever") is None and "variant" not in r]
    return sorted(plain, key=lambda r: (order.index(r["strategy"]), float(r["target"]))) + [
        r for r in merged if r.get("lever") is not None or "variant" in r
    ]


def point_from_run(strategy: str, target: float, out: Path) -> dict[str, Any]:
    """One point's figures, all read from its run directory. Its wall s is the run's own training
    wall (summary.json), so a fresh run and a later ``--collect-only`` of it tabulate the same figure
    (the subprocess's time would add the quick evaluation to the one and not the other)."""
    privacy = json.loads((out / "privacy.json").read_text())
    evaluation = json.loads((out / "eval.json").read_text())
    config = json.loads((out / "config.json").read_text())
    reported, again = reported_epsilon(strategy, privacy), recomputed_epsilon(strategy, privacy)
    if (reported is None) != (again is None) or (
        reported is not None and not math.isclose(reported, again, rel_tol=1e-9)
    ):
        raise SystemExit(f"{out}: the printed ε {reported} does not recompute from privacy.json ({again})")
    noise = {
        "gswgan": "noise_multiplier",
        "dpgan": "dpgan_noise_multiplier",
        "fedavg-gan": "fedavg_noise_multiplier",
        "dp-merf": "merf_noise_multiplier",
        "dp-ntk": "merf_noise_multiplier",
    }
    return {
        "strategy": strategy,
        "target": target,
        "epsilon": reported,
        "epsilon_recomputed": again,
        "epsilon_dp_accounting": dp_accounting_epsilon(strategy, privacy),
        "epsilon_unit": SECURE_UNIT if config.get("secure_aggregation") else UNITS[strategy],
        "secure_aggregation": bool(config.get("secure_aggregation")),
        "delta": privacy["delta"],
        "noise_multiplier": config[noise[strategy]],
        "steps": config["steps"],
        "fid": evaluation["fid"]["value"],
        "fid_samples": evaluation["fid"]["num_samples"],
        "fid_domain": evaluation["fid_domain"]["value"],
        "inception_score": evaluation["inception_score"]["mean"],
        "gen2real_cnn": evaluation["gen2real_acc"]["cnn"],
        "gen2real_mlp": evaluation["gen2real_acc"]["mlp"],
        "real2gen_cnn": evaluation["real2gen_acc"]["cnn"],
        "real2gen_mlp": evaluation["real2gen_acc"].get("mlp"),
        "wall_s": json.loads((out / "summary.json").read_text()).get("wall_s"),
        "run_dir": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--only", default="", help="comma-separated strategies (default: all four)")
    parser.add_argument("--targets", default="1,10,100,inf", help="comma-separated target ε (inf: no noise)")
    parser.add_argument(
        "--levers-at", type=float, default=100.0, help="target ε of GS-WGAN's lever rows (0: no lever rows)"
    )
    parser.add_argument(
        "--variants",
        default="all",
        help="the source papers' method rows at --levers-at: all, none, or comma-separated indices into VARIANTS",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--fid-samples", type=int, default=500, help="Inception FID samples N per point")
    parser.add_argument("--inception", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--protocol",
        choices=("quick", "dpimagebench", "dpimagebench-cpu"),
        default="quick",
        help="also evaluate each point under DPImageBench's protocol (fedgan evaluate --protocol; not with "
        "--collect-only, which reads the figures runs already have) and add its column",
    )
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "frontier", help="run directories")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs in --work instead of rerunning")
    parser.add_argument(
        "--collect-only",
        action="store_true",
        help="run nothing: tabulate the finished runs in --work (others: not run)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the points of the frontier already in --out (its JSON) and add or replace these, cell by cell",
    )
    parser.add_argument("extra", nargs="*", help="more simulate flags for every run (after --)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    strategies = [s for s in (args.only.split(",") if args.only else UNITS) if s]
    targets = [math.inf if t.strip() == "inf" else float(t) for t in args.targets.split(",")]
    jobs = [(s, t, None, None) for s in strategies for t in targets]
    levers = bool(args.levers_at) and "gswgan" in strategies
    if levers:  # the last lever row is the main row at that target (run once, added below)
        jobs += [("gswgan", args.levers_at, i, None) for i in range(len(LEVERS[args.scale]) - 1)]
        if args.levers_at not in targets:
            jobs.append(("gswgan", args.levers_at, None, None))
    chosen = variant_indices(args.variants) if args.levers_at else []
    jobs += [(VARIANTS[i][0], args.levers_at, None, i) for i in chosen if VARIANTS[i][0] in strategies]
    for s in {VARIANTS[i][0] for i in chosen if VARIANTS[i][0] in strategies}:
        if args.levers_at not in targets and (s, args.levers_at, None, None) not in jobs:
            jobs.append((s, args.levers_at, None, None))  # the variants' baseline
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda job: one_point(args.scale, job[0], job[1], args, job[2], job[3]), jobs))
    if levers:
        full = next(
            r
            for r in rows
            if r["strategy"] == "gswgan" and r["target"] == args.levers_at and "variant" not in r and not r.get("lever")
        )
        rows.append({**full, "lever": LEVERS[args.scale][-1][0]})
        if args.levers_at not in targets and not chosen:  # the variants need it as their baseline
            rows.remove(full)
    for r in rows:
        print(json.dumps({k: r.get(k) for k in ("strategy", "target", "epsilon", "fid", "gen2real_cnn", "error")}))
    stem = f"frontier-{args.dataset}-{args.scale}"
    command = "python bench/frontier.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.merge and (args.out / f"{stem}.json").exists():
        before = json.loads((args.out / f"{stem}.json").read_text())
        rows = merge_points(before["points"], rows)
        command = f"{before['command'].strip()}`, then `{command.strip()}"
    result = {
        "benchmark": "frontier",
        "scale": args.scale,
        "dataset": args.dataset,
        "command": command,
        "wall_s": time.perf_counter() - start,
        "flags": SCALES[args.scale],
        "levers": LEVERS[args.scale],
        "points": rows,
        "published": PUBLISHED,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(rows, command.strip()))
    ok = [r for r in rows if "error" not in r and r.get("lever") is None and "variant" not in r]
    plot_frontier(
        ok,
        args.out / f"{stem}.png",
        metric="fid" if args.inception else "fid_domain",
        title=f"{args.dataset}, {args.scale} scale: quality vs ε (each strategy in its own unit)",
    )
    best = {
        s: max((r["gen2real_cnn"] for r in ok if r["strategy"] == s and r["target"] == 10), default=None)
        for s in strategies
    }
    failed = [r for r in rows if "error" in r]
    print(
        f"frontier: {len(rows) - len(failed)}/{len(rows)} runs in {result['wall_s']:.0f} s; "
        f"gen2real at target ε=10: {best} -> {args.out / stem}.*"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
