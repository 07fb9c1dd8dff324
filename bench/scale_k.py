"""K = 1,000 -> 10,000 -> 100,000 simulated clients in one process: peak memory and time per step.

``bench/scale.py`` compares Flower's simulation with the in-process transport up to FEMNIST's 3,400
clients; this one takes the in-process transport to the sizes of federated populations in the
literature (10^5 devices and more), for the two ways a run touches its clients:

- ``gswgan``: m clients per generator step, each client's private D created on first contact and
  kept on disk; what must stay flat as K grows is the time per step (same m) and the memory;
- ``dp-merf``: every client releases once (the collection, asked in rounds of ``COLLECT_CHUNK``
  clients), then the server trains G alone: total wall time and peak memory.

Data: the embedded synthetic handwriting, one writer per client, rendered on demand from the
writer's own seed (so 10^5 writers cost nothing until a client is asked), 32 images each: the
smallest partition GS-WGAN's batches of B = 32 allow, which keeps DP-MERF's collection near 10 ms
per client. Fashion-MNIST's 60,000 images cannot give 10^5 clients a batch each.

Each (method, K, repeat) arm runs in a fresh child process, its memory sampled by the parent
(``bench/proctree.py``); the repeats go through the K values in alternating order (up, down, up),
so that a drift in the machine's load hits every K alike. Time per step: the period between the
starts of consecutive GS-WGAN step exchanges after the first ``--skip``, median; CPU seconds per
step beside it. Every process computes on one thread (``bench/scale.py`` says why). Writes
``bench/results/scale-k.json`` and prints one line.

    python bench/scale_k.py [--ks 1000,10000,100000] [--methods gswgan,dp-merf] [--steps 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
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

from proctree import SAMPLE_EVERY_S, TreeSampler  # noqa: E402  (bench/ is the script's folder)
from scale import TimedTransport, _child_env, _disk_bytes, _phase, _step_periods  # noqa: E402

MIB = 1 << 20
GOAL_RSS_BYTES = 8 * 10**9  # the issue's "peak RSS <= 8 GB" at K = 100,000
GOAL_STEP_RATIO = 1.2  # GS-WGAN's time per step at K = 100,000 vs K = 1,000, same m
SAMPLES_PER_WRITER = 32
MESSAGE_TYPES = {"gswgan": "train.gswgan", "dp-merf": "train.dpmerf"}


# --- the parent: one child process per arm ---------------------------------------------------------


def run_arm(method: str, k: int, args: argparse.Namespace) -> dict[str, Any]:
    """One arm in a fresh child process; its figures plus the process tree's peak memory."""
    with tempfile.TemporaryDirectory(prefix="fedgan-scale-k-", dir=args.tmp or None) as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", "--method", method, "--k", str(k), "--steps", str(args.steps)]
        cmd += ["--merf-steps", str(args.merf_steps), "--m", str(args.m), "--skip", str(args.skip)]
        cmd += ["--result", str(result_path), "--workdir", tmp]
        started = time.monotonic()
        child = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(1))
        sampler = TreeSampler(child.pid)
        sampler.start()
        try:
            rc = child.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            rc = child.wait()
        finally:
            sampler.done.set()
            sampler.join()
        arm = {"method": method, "k": k, "elapsed_s": round(time.monotonic() - started, 2)}
        if rc != 0 or not result_path.exists():
            return {**arm, "error": f"child exited with {rc}", "peak_rss_mib": round(sampler.peak_rss / MIB, 1)}
        result = json.loads(result_path.read_text())
    return {**arm, **result, "peak_rss_mib": round(sampler.peak_rss / MIB, 1)}


def arm_order(methods: list[str], ks: list[int], repeats: int, merf_repeats: int) -> list[tuple[str, int]]:
    """Every (method, K) arm once per repeat, K up in even repeats and down in odd ones, the methods
    side by side at each K; DP-MERF only in its first ``merf_repeats`` repeats (its K = 10^5 arm
    alone takes about half an hour here)."""
    order = []
    for r in range(repeats):
        for k in ks if r % 2 == 0 else ks[::-1]:
            order += [(m, k) for m in methods if m != "dp-merf" or r < merf_repeats]
    return order


# --- the child: one run, timed exchange by exchange ---------------------------------------------------


def _status_mib(field: str) -> float:
    """VmRSS or VmHWM of this process, MiB."""
    text = Path("/proc/self/status").read_text()
    return round(int(text.split(f"{field}:")[1].split()[0]) / 1024, 1)


class GcClock:
    """Seconds Python's garbage collector ran, and its full (generation 2) collections: their cost
    grows with every object alive, so a federation held in memory would show here."""

    def __init__(self) -> None:
        self.seconds, self.full, self._began = 0.0, 0, 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._began
        self.full += info["generation"] == 2


class PhaseClock(TimedTransport):
    """``TimedTransport`` that also notes, when the first step exchange starts (after the hello),
    this process's resident memory (what holding the federation costs) and the collector's time."""

    rss_after_hello_mib: float | None = None
    gc_at_first_step: tuple[float, int] = (0.0, 0)

    def __init__(self, *args: Any, gc_clock: GcClock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gc_clock = gc_clock

    def exchange(self, outgoing: list, **kwargs: Any) -> Any:
        if self.rss_after_hello_mib is None and outgoing and outgoing[0].message_type.startswith("train."):
            self.rss_after_hello_mib = _status_mib("VmRSS")
            self.gc_at_first_step = (self.gc_clock.seconds, self.gc_clock.full)
        return super().exchange(outgoing, **kwargs)

    def gc_since_first_step(self) -> dict[str, float]:
        return {
            "seconds": round(self.gc_clock.seconds - self.gc_at_first_step[0], 3),
            "full_collections": self.gc_clock.full - self.gc_at_first_step[1],
        }


def arm_config(method: str, k: int, steps: int, out: Path, m: int):
    """One writer per client, 32 images each, the small model, no evaluation, no sample grids."""
    from common.methods import ExperimentConfig

    common = dict(
        strategy=method,
        dataset="synthetic",
        partition="writer",
        num_clients=k,
        synthetic_writers=k,
        synthetic_samples_per_writer=SAMPLES_PER_WRITER,
        model="small",
        steps=steps,
        out=str(out),
        progress=False,
        eval=False,
        sample_every=10**6,
        checkpoint_every=10**6,
    )
    if method == "gswgan":
        return ExperimentConfig(**common, batch_size=32, n_critic=5, clients_per_step=m)
    return ExperimentConfig(**common)


def _max_files_per_folder(path: Path) -> int:
    counts: dict[Path, int] = {}
    for p in path.rglob("*"):
        if p.is_file():
            counts[p.parent] = counts.get(p.parent, 0) + 1
    return max(counts.values(), default=0)


def child_main(args: argparse.Namespace, t0: float) -> None:
    """Run one arm and write its figures to ``args.result``."""
    import torch

    from server.loop import run_experiment
    from server.reporting import RunDirectory
    from simulations.experiments.simulate import run_on_transport

    torch.set_num_threads(1)
    steps = args.steps if args.method == "gswgan" else args.merf_steps
    cfg = arm_config(args.method, args.k, steps, Path(args.workdir) / "run", args.m)
    run = RunDirectory.create(cfg)
    holder: dict[str, PhaseClock] = {}

    gc_clock = GcClock()

    def server_fn(transport: Any) -> dict[str, Any]:
        holder["t"] = PhaseClock(transport, t0, first=args.skip, last=steps - 1, gc_clock=gc_clock)
        return run_experiment(cfg, run, holder["t"], transport_name="inprocess")

    summary, error = run_on_transport(cfg.num_clients, server_fn, "inprocess", node_state=run.state_dir)
    if error is not None:
        raise error
    clock = holder["t"]
    figures = _method_figures(args.method, clock, summary, args.skip)
    disk, files = _disk_bytes(run.state_dir)
    Path(args.result).write_text(
        json.dumps(
            {
                "steps": summary["steps_completed"],
                "status": summary["status"],
                **figures,
                "hello": _phase(clock.events, "query.hello"),
                "ledger_fetch": _phase(clock.events, "query.ledger"),
                "total_s": round(time.monotonic() - t0, 3),
                "rss_after_hello_mib": clock.rss_after_hello_mib,
                "gc_after_hello": clock.gc_since_first_step(),
                "hwm_mib": _status_mib("VmHWM"),
                "state_disk_mib": round(disk / MIB, 2),
                "state_files": files,
                "max_files_per_folder": _max_files_per_folder(run.state_dir),
            }
        )
    )


def _method_figures(method: str, clock: PhaseClock, summary: dict[str, Any], skip: int) -> dict[str, Any]:
    """GS-WGAN: time and CPU per step. DP-MERF: the collection (its rounds, and the time per client
    of its first and last rounds: a client's files land in one folder, which must not slow down as it
    fills) and the wall of the whole run."""
    events = [e for e in clock.events if e[0] == MESSAGE_TYPES[method]]
    startup = next(e[2] for e in events)
    if method == "gswgan":
        periods = _step_periods(clock.events, skip)
        return {
            "startup_s": round(startup, 3),
            "step_s_median": statistics.median(periods),
            "step_s_mean": statistics.fmean(periods),
            "step_cpu_s": clock.cpu_per_step_s(),
            "clients_per_step": events[0][1],
        }
    per_client = [(end - start) / n * 1e3 for _, n, start, end in events]
    return {
        "startup_s": round(startup, 3),
        "collection": _phase(clock.events, MESSAGE_TYPES[method]),
        "collection_rounds": len(events),
        "ms_per_client_first_round": round(per_client[0], 2),
        "ms_per_client_last_round": round(per_client[-1], 2),
        "releases": sum(c["queries"] for c in summary["clients"]),
        "training_wall_s": round(summary["wall_s"], 3),
    }


# --- report --------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, K): medians of times over the repeats, maxima of memory; GS-WGAN's step
    time relative to its smallest K, each repeat's ratio to the same repeat's smallest K beside it."""
    rows = []
    for method, k in sorted({(r["method"], r["k"]) for r in runs}):
        ok = [r for r in runs if (r["method"], r["k"]) == (method, k) and "error" not in r]
        if not ok:
            rows.append({"method": method, "k": k, "error": "every repeat failed"})
            continue
        row: dict[str, Any] = {
            "method": method,
            "k": k,
            "repeats": len(ok),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ok),
            "rss_after_hello_mib": max(r["rss_after_hello_mib"] or 0 for r in ok),
            "hello_s": statistics.median(r["hello"]["seconds"] for r in ok),
            "total_s": statistics.median(r["total_s"] for r in ok),
            "state_disk_mib": max(r["state_disk_mib"] for r in ok),
            "state_files": max(r["state_files"] for r in ok),
            "max_files_per_folder": max(r["max_files_per_folder"] for r in ok),
        }
        if method == "gswgan":
            row["step_s"] = statistics.median(r["step_s_median"] for r in ok)
            row["step_s_each_repeat"] = [round(r["step_s_median"], 4) for r in ok]
            cpu = [r["step_cpu_s"] for r in ok if r["step_cpu_s"]]
            row["step_cpu_s"] = statistics.median(cpu) if cpu else None
            row["gc_ms_per_step"] = statistics.median(1e3 * r["gc_after_hello"]["seconds"] / r["steps"] for r in ok)
        else:
            for key in ("collection_rounds", "ms_per_client_first_round", "ms_per_client_last_round", "releases"):
                row[key] = ok[0][key]
            row["collection_s"] = statistics.median(r["collection"]["seconds"] for r in ok)
            row["training_wall_s"] = statistics.median(r["training_wall_s"] for r in ok)
        rows.append(row)
    _ratios(rows)
    return rows


def _ratios(rows: list[dict[str, Any]]) -> None:
    """GS-WGAN's step and CPU times as multiples of its smallest K's, and the issue's two goals."""
    gs = [r for r in rows if r["method"] == "gswgan" and "error" not in r]
    for row in rows:
        if "error" in row:
            continue
        row["rss_goal_met"] = row["peak_rss_mib"] * MIB <= GOAL_RSS_BYTES
        if row["method"] != "gswgan" or not gs:
            continue
        base = gs[0]
        row["step_ratio"] = round(row["step_s"] / base["step_s"], 3)
        if row["step_cpu_s"] and base["step_cpu_s"]:
            row["step_cpu_ratio"] = round(row["step_cpu_s"] / base["step_cpu_s"], 3)
        row["step_goal_met"] = row["step_ratio"] <= GOAL_STEP_RATIO


def _line(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        head = f"{r['method']} K={r['k']:,}"
        if "error" in r:
            parts.append(f"{head}: {r['error']}")
        elif r["method"] == "gswgan":
            cpu = f", cpu x{r['step_cpu_ratio']:.2f}" if "step_cpu_ratio" in r else ""
            parts.append(
                f"{head}: {r['step_s'] * 1e3:.0f} ms/step (x{r['step_ratio']:.2f}{cpu}), "
                f"peak RSS {r['peak_rss_mib']:.0f} MiB, hello {r['hello_s']:.0f} s"
            )
        else:
            parts.append(
                f"{head}: {r['total_s']:.0f} s in all ({r['collection_s']:.0f} s collecting), "
                f"peak RSS {r['peak_rss_mib']:.0f} MiB"
            )
    return "scale_k: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="1000,10000,100000")
    parser.add_argument("--methods", default="gswgan,dp-merf")
    parser.add_argument("--steps", type=int, default=40, help="GS-WGAN generator steps per arm")
    parser.add_argument("--merf-steps", type=int, default=20, help="DP-MERF generator steps after its collection")
    parser.add_argument("--m", type=int, default=1, help="GS-WGAN clients per step")
    parser.add_argument("--skip", type=int, default=5, help="first GS-WGAN steps left out of the step time")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all K, in alternating order")
    parser.add_argument("--merf-repeats", type=int, default=1, help="of those, the rounds DP-MERF takes part in")
    parser.add_argument("--timeout-s", type=float, default=4 * 3600.0)
    parser.add_argument("--tmp", default="", help="where the arms' run directories go (default: the system's)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale-k.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="gswgan", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args, T0)
        return 0
    ks, methods = [int(k) for k in args.ks.split(",")], args.methods.split(",")
    runs = []
    for method, k in arm_order(methods, ks, args.repeats, args.merf_repeats):
        runs.append(run_arm(method, k, args))
        print(f"  {method} K={k:,}: " + json.dumps({key: runs[-1].get(key) for key in _SHOWN}), flush=True)
    rows = summarize(runs)
    out = {
        "command": "python bench/scale_k.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {
            "transport": "inprocess",
            "data": f"synthetic, one writer per client, {SAMPLES_PER_WRITER} images each",
            "model": "small",
            "gswgan": {"batch_size": 32, "n_critic": 5, "clients_per_step": args.m, "steps": args.steps},
            "dp_merf": {"steps_after_collection": args.merf_steps},
            "skip": args.skip,
            "repeats": args.repeats,
            "merf_repeats": args.merf_repeats,
            "threads": 1,
            "sample_every_s": SAMPLE_EVERY_S,
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
        },
        "summary": rows,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(_line(rows) + f" -> {args.out}", flush=True)
    return 0 if all("error" not in r for r in rows) else 1


_SHOWN = ("error", "step_s_median", "step_cpu_s", "total_s", "peak_rss_mib", "elapsed_s")
T0 = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
