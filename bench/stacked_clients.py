"""m clients per GS-WGAN step: their critic phases stacked into one network vs one client after another.

Both arms run the method's own functions on the same clients, side by side in one process (arms
alternate, repeated): the server draws m query batches (``ServerGenerator.query_batches``), each
sampled client selects its critic fakes, then either ``stacked_critic_phase`` (every client's
n_critic WGAN-GP steps and per-sample gradients as one grouped-convolution network,
``common/methods/gswgan/critic_stack.py``) or ``answer_pending`` per client; each answer is sanitized with its
client's noise and wire-encoded, and G steps once on the m answers. K clients are resident and
the m of each step are taken round robin, so every client's state (D, Adam, power iteration)
carries over between its turns as in a run.

    python bench/stacked_clients.py [--device auto] [--model small] [--m 1,2,4,8,16] [--steps 20] [--repeats 3]

Writes ``bench/results/stacked_clients-<device>-<model>.json`` and prints one line per m and a summary.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_step import resident_clients, sync  # noqa: E402
from common.data import num_classes_for  # noqa: E402
from common.device import resolve_device  # noqa: E402
from common.io.codec import decode_grads  # noqa: E402
from common.methods import ExperimentConfig  # noqa: E402
from common.methods.gswgan.client import PendingAnswer, answer_pending, stacked_critic_phase  # noqa: E402
from common.methods.gswgan.critic import select_critic_fakes  # noqa: E402
from common.methods.gswgan.generator import ServerGenerator  # noqa: E402

ARMS = ("one_by_one", "stacked")


def build(args: argparse.Namespace, m: int) -> tuple[ExperimentConfig, ServerGenerator, list]:
    cfg = ExperimentConfig(
        model=args.model,
        device=args.device,
        num_clients=max(args.clients, m),
        clients_per_step=m,
        batch_size=args.batch,
        n_critic=args.n_critic,
        critic_fakes=args.critic_fakes,
        noise_multiplier=1.07,
        wire_compression="none",
    )
    server = ServerGenerator(cfg, num_classes_for(cfg))
    return cfg, server, resident_clients(cfg, server.device)


def one_step(cfg: ExperimentConfig, server: ServerGenerator, group: list, step: int, stacked: bool) -> None:
    """One generator step with ``group`` as the sampled clients, without the wire's transport."""
    B = cfg.batch_size
    extra = cfg.n_critic if cfg.critic_fakes == "fresh" else 0
    pending, attached = [], []
    for state in group:
        fakes, labels, last = server.query_batches(B, extra)
        fakes, labels = fakes.to(server.device), labels.to(server.device)
        critic_x, critic_y = select_critic_fakes(state, cfg, fakes, labels, B)
        pending.append(PendingAnswer(state, step, fakes, labels, critic_x, critic_y, B))
        attached.append(last)
    answers = stacked_critic_phase(pending, cfg) if stacked else [answer_pending(p, cfg) for p in pending]
    grads = [torch.from_numpy(decode_grads(a.grad, a.grad_encoding, batch_size=B)) for a in answers]
    server.apply(attached, grads, divisor=B * len(group))


def time_arm(cfg, server, clients, m: int, stacked: bool, steps: int, start: int) -> float:
    """Median seconds per step over ``steps`` steps, the m clients of each taken round robin."""
    times = []
    for i in range(start, start + steps):
        group = [clients[(i * m + j) % len(clients)] for j in range(m)]
        t0 = time.perf_counter()
        one_step(cfg, server, group, i, stacked)
        sync(server.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_m(args: argparse.Namespace, m: int) -> dict:
    cfg, server, clients = build(args, m)
    for stacked in (False, True):  # warm-up: first contact, allocator, kernels
        time_arm(cfg, server, clients, m, stacked if m > 1 else False, args.warmup, 0)
    medians: dict[str, list[float]] = {arm: [] for arm in ARMS}
    step = args.warmup
    for _ in range(args.repeats):
        for arm in ARMS:
            stacked = arm == "stacked" and m > 1  # one client: nothing to stack
            medians[arm].append(time_arm(cfg, server, clients, m, stacked, args.steps, step))
            step += args.steps
    ms = {arm: 1000 * statistics.median(v) for arm, v in medians.items()}
    return {
        "m": m,
        "ms_per_step": ms,
        "ms_per_client_step": {arm: v / m for arm, v in ms.items()},
        "speedup_stacked": ms["one_by_one"] / ms["stacked"],
        "repeat_medians_ms": {arm: [1000 * x for x in v] for arm, v in medians.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--model", default="small", help="model preset (paper: GS-WGAN's networks)")
    parser.add_argument("--m", default="1,2,4,8,16", help="clients per step, comma-separated")
    parser.add_argument("--clients", type=int, default=32, help="K resident clients (at least m)")
    parser.add_argument("--batch", type=int, default=32, help="B")
    parser.add_argument("--n-critic", type=int, default=5, help="critic steps per query")
    parser.add_argument("--critic-fakes", default="fresh", help="fresh, query or replay")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm and repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two arms")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--out", default="", help="result JSON (default: bench/results/stacked_clients-<device>-<model>.json)"
    )
    args = parser.parse_args(argv)
    device = resolve_device(args.device)  # a clear error before any work
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for m in (int(x) for x in args.m.split(",")):
        row = measure_m(args, m)
        rows.append(row)
        ms = row["ms_per_step"]
        print(
            f"  m={m:3d}: one by one {ms['one_by_one']:8.1f} ms/step, stacked {ms['stacked']:8.1f} ms/step "
            f"({row['speedup_stacked']:.2f}x)",
            flush=True,
        )
    result = {
        "benchmark": "stacked_clients",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "batch_size": args.batch,
        "n_critic": args.n_critic,
        "critic_fakes": args.critic_fakes,
        "clients": args.clients,
        "steps_per_arm": args.steps,
        "repeats": args.repeats,
        "rows": rows,
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"stacked_clients-{device.type}-{args.model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    best = max(rows, key=lambda r: r["speedup_stacked"])
    print(
        f"stacked_clients: {args.model} on {result['device_name']} ({device}), "
        f"B={args.batch}, n_critic={args.n_critic}: "
        + ", ".join(f"m={r['m']} {r['speedup_stacked']:.2f}x" for r in rows)
        + f" (stacked vs one by one; best m={best['m']}) -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
