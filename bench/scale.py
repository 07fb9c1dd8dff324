"""GS-WGAN with thousands of clients in one simulation: memory, step time, start-up and disk vs. K.

Every client (one synthetic writer each) has its own private discriminator. The question is what
grows with the federation's size K rather than with the clients active in a step (m = 1 here):
peak memory of the whole process tree (the driver plus Ray's processes and workers), time per
generator step, start-up time (Flower's node registration, the run's hello to every node) and the
disk used by the clients' state files.

Each (transport, K) arm runs in a fresh child process (``--child``), so that one arm's Ray cluster
or caches never count against the next; the parent samples the child's process tree in /proc
every 0.5 s. Resident memory is reported twice: the sum of RSS (counts shared pages, e.g. torch's
libraries, once per process: an upper bound) and the sum of PSS (shares them out: what the tree
really costs). The ``flower`` arm is the real path, ``simulations.simulate.run_on_transport`` with
Flower's simulation runtime (Ray backend); ``inprocess`` calls the ClientApp directly, for reference.

Every process runs ``--threads`` intra-op threads (default 1). The machine this was written on
is shared: with two threads per process, OpenMP's spin-waiting under contention made one client
answer 10x slower and its time swing by 2x between runs, which hides any effect of K.

Time per step is the period between the starts of consecutive generator-step exchanges (the whole
step: the query, the client's work, the server's update, metrics lines), median over the steps
after the first ``--skip`` ones; beside it, the tree's CPU seconds per step over the same steps,
which other work on the machine disturbs less. ``--repeats`` runs all arms again, interleaved, and
reports medians. Writes ``bench/results/scale.json`` and prints one line.

    python bench/scale.py [--ks 20,340,3400] [--steps 30] [--repeats 3] [--transports flower,inprocess]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20

from proctree import SAMPLE_EVERY_S, TreeSampler, tree_cpu_s  # noqa: E402  (bench/ is the script's folder)

# --- the parent: one child process per arm, its process tree sampled in /proc ------------------


def _child_env(threads: int | None) -> dict[str, str]:
    """The child's environment: ``threads`` intra-op threads in every process of the tree (the
    ClientApp reads FEDGAN_CLIENT_THREADS; Ray's workers inherit the driver's environment)."""
    env = dict(os.environ)
    if threads:
        for name in ("FEDGAN_CLIENT_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    return env


def run_arm(transport: str, k: int, steps: int, skip: int, timeout_s: float, threads: int | None) -> dict[str, Any]:
    """One arm in a fresh child process; returns the child's figures plus the tree's peak memory."""
    with tempfile.TemporaryDirectory(prefix="fedgan-scale-") as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--transport",
            transport,
            "--k",
            str(k),
            "--steps",
            str(steps),
            "--skip",
            str(skip),
            "--result",
            str(result_path),
            "--workdir",
            tmp,
        ]
        started = time.monotonic()
        child = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(threads))
        sampler = TreeSampler(child.pid)
        sampler.start()
        try:
            rc = child.wait(timeout=timeout_s)
        finally:
            sampler.done.set()
            sampler.join()
        if rc != 0 or not result_path.exists():
            return {
                "transport": transport,
                "k": k,
                "error": f"child exited with {rc}",
                "elapsed_s": time.monotonic() - started,
            }
        result = json.loads(result_path.read_text())
    top = sorted(sampler.peak_by_process.items(), key=lambda kv: -kv[1])[:6]
    result.update(
        peak_rss_sum_mib=round(sampler.peak_rss / MIB, 1),
        peak_pss_sum_mib=round(sampler.peak_pss / MIB, 1),
        peak_processes=sampler.peak_processes,
        elapsed_s=round(time.monotonic() - started, 2),
        pss_at_peak_mib={name: round(v / MIB, 1) for name, v in top},
    )
    return result


# --- the child: one run, timed exchange by exchange --------------------------------------------


class TimedTransport:
    """Wraps the loop's transport and records when each exchange of each message type ran.

    Also reads the process tree's CPU time at the start of the step exchanges ``first`` and
    ``last``: CPU per step is less disturbed than wall time by other work on a shared machine.
    """

    def __init__(self, inner: Any, t0: float, first: int, last: int) -> None:
        self.inner, self.t0, self.first, self.last = inner, t0, first, last
        self.events: list[tuple[str, int, float, float]] = []  # (type, messages, start, end)
        self.steps_seen, self.cpu_s = 0, {}

    @property
    def setup_totals(self) -> tuple[int, int]:
        return self.inner.setup_totals

    def node_ids(self, expected: int) -> list[int]:
        return self.inner.node_ids(expected)

    def exchange(self, outgoing: list, **kwargs: Any) -> Any:
        kind = outgoing[0].message_type if outgoing else "none"
        if kind.startswith("train."):
            if self.steps_seen in (self.first, self.last):
                self.cpu_s[self.steps_seen] = tree_cpu_s(os.getpid())
            self.steps_seen += 1
        start = time.monotonic() - self.t0
        result = self.inner.exchange(outgoing, **kwargs)
        self.events.append((kind, len(outgoing), start, time.monotonic() - self.t0))
        return result

    def cpu_per_step_s(self) -> float | None:
        if len(self.cpu_s) < 2:
            return None
        return (self.cpu_s[self.last] - self.cpu_s[self.first]) / (self.last - self.first)


def _phase(events: list[tuple[str, int, float, float]], kind: str) -> dict[str, float]:
    """Total time and messages of the exchanges of one message type."""
    rows = [e for e in events if e[0] == kind]
    return {"messages": sum(e[1] for e in rows), "seconds": round(sum(e[3] - e[2] for e in rows), 3)}


def _step_periods(events: list[tuple[str, int, float, float]], skip: int) -> list[float]:
    """Seconds between the starts of consecutive generator-step exchanges, after ``skip`` steps."""
    starts = [e[2] for e in events if e[0].startswith("train.")]
    return [b - a for a, b in zip(starts, starts[1:], strict=False)][skip:]


def _disk_bytes(path: Path) -> tuple[int, int]:
    """(bytes allocated on disk, files) under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return sum(p.stat().st_blocks * 512 for p in files), len(files)


def child_main(args: argparse.Namespace, t0: float) -> None:
    """Run one arm and write its figures to ``args.result``."""
    import torch

    from server.loop import run_experiment
    from server.reporting import RunDirectory
    from simulations.experiments.simulate import run_on_transport

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cfg = scale_config(args.k, args.steps, Path(args.workdir) / "run")
    run = RunDirectory.create(cfg)
    holder: dict[str, TimedTransport] = {}

    def server_fn(transport: Any) -> dict[str, Any]:
        holder["t"] = TimedTransport(transport, t0, first=args.skip, last=args.steps - 1)
        return run_experiment(cfg, run, holder["t"], transport_name=args.transport)

    summary, error = run_on_transport(cfg.num_clients, server_fn, args.transport, node_state=run.state_dir)
    if error is not None:
        raise error
    events = holder["t"].events
    periods = _step_periods(events, args.skip)
    disk, files = _disk_bytes(run.state_dir)
    first_step = next(e[2] for e in events if e[0].startswith("train."))
    Path(args.result).write_text(
        json.dumps(
            {
                "transport": args.transport,
                "k": args.k,
                "steps": summary["steps_completed"],
                "step_s_median": statistics.median(periods),
                "step_s_mean": statistics.fmean(periods),
                "step_cpu_s": holder["t"].cpu_per_step_s(),
                "loop_step_latency_median_s": summary["step_latency_s"]["median"],
                "loop_wall_per_step_s": summary["wall_s"] / max(summary["steps_completed"], 1),
                "startup_s": round(first_step, 3),
                "hello": _phase(events, "query.hello"),
                "ledger_fetch": _phase(events, "query.ledger"),
                "total_s": round(time.monotonic() - t0, 3),
                "state_disk_bytes": disk,
                "state_files": files,
            }
        )
    )


def scale_config(k: int, steps: int, out: Path):
    """The benchmark's configuration: all K writers of (synthetic) federated EMNIST, m = 1."""
    from common.methods import ExperimentConfig

    return ExperimentConfig(
        dataset="synthetic",
        partition="writer",
        synthetic_writers=k,
        num_clients=k,
        model="small",
        batch_size=32,
        n_critic=5,
        clients_per_step=1,
        steps=steps,
        out=str(out),
        progress=False,
        eval=False,
        sample_every=10**6,
        checkpoint_every=10**6,
    )


# --- report --------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (transport, K) over its repeats, with step times relative to the smallest K."""
    arms = sorted({(r["transport"], r["k"]) for r in runs})
    rows = [
        _summary_row(t, k, [r for r in runs if (r["transport"], r["k"]) == (t, k) and "error" not in r])
        for t, k in arms
    ]
    for row in rows:
        base = next((b for b in rows if b["transport"] == row["transport"] and "error" not in b), None)
        if "error" not in row and base is not None:
            row["step_ratio"] = round(row["step_s"] / base["step_s"], 3)
            if row["step_cpu_s"] and base["step_cpu_s"]:
                row["step_cpu_ratio"] = round(row["step_cpu_s"] / base["step_cpu_s"], 3)
    return rows


def _summary_row(transport: str, k: int, ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of times over the repeats, maxima of memory and disk."""
    if not ok:
        return {"transport": transport, "k": k, "error": "every repeat failed"}

    def med(get: Any) -> float:
        return statistics.median(get(r) for r in ok)

    return {
        "transport": transport,
        "k": k,
        "repeats": len(ok),
        "step_s": med(lambda r: r["step_s_median"]),
        "step_s_each_repeat": [round(r["step_s_median"], 4) for r in ok],
        "step_cpu_s": med(lambda r: r["step_cpu_s"]) if all(r["step_cpu_s"] for r in ok) else None,
        "peak_pss_mib": max(r["peak_pss_sum_mib"] for r in ok),
        "peak_rss_sum_mib": max(r["peak_rss_sum_mib"] for r in ok),
        "startup_s": med(lambda r: r["startup_s"]),
        "hello_s": med(lambda r: r["hello"]["seconds"]),
        "ledger_fetch_s": med(lambda r: r["ledger_fetch"]["seconds"]),
        "ledger_fetch_messages": ok[0]["ledger_fetch"]["messages"],
        "state_disk_mib": round(max(r["state_disk_bytes"] for r in ok) / MIB, 2),
        "state_files": max(r["state_files"] for r in ok),
    }


def _line(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        if "error" in r:
            parts.append(f"{r['transport']} K={r['k']}: {r['error']}")
            continue
        cpu = f", cpu x{r['step_cpu_ratio']:.2f}" if "step_cpu_ratio" in r else ""
        parts.append(
            f"{r['transport']} K={r['k']}: {r['step_s'] * 1e3:.0f} ms/step (x{r['step_ratio']:.2f}{cpu}), "
            f"PSS {r['peak_pss_mib']:.0f} MiB (RSS sum {r['peak_rss_sum_mib']:.0f}), "
            f"start-up {r['startup_s']:.1f} s, disk {r['state_disk_mib']:.1f} MiB"
        )
    return "scale: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="20,340,3400")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the step time")
    parser.add_argument("--transports", default="flower,inprocess")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all arms, interleaved")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads per process (0: the project's defaults); see above"
    )
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--transport", default="flower", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args, T0)
    arms = [(t, k) for t in args.transports.split(",") for k in map(int, args.ks.split(","))]
    runs = [
        run_arm(t, k, args.steps, args.skip, args.timeout_s, args.threads) for _ in range(args.repeats) for t, k in arms
    ]
    rows = summarize(runs)
    out = {
        "config": {
            "steps": args.steps,
            "skip": args.skip,
            "repeats": args.repeats,
            "model": "small",
            "batch_size": 32,
            "n_critic": 5,
            "clients_per_step": 1,
            "sample_every_s": SAMPLE_EVERY_S,
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_average_at_end": os.getloadavg(),
        },
        "summary": rows,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(_line(rows) + f" -> {args.out}", flush=True)


T0 = time.monotonic()

if __name__ == "__main__":
    main()
