"""Where a GS-WGAN step's time goes on a GPU: torch.profiler over steps of ``bench/gpu_step.py``'s
``one_step`` (one arm), the top kernels and host calls, and how many host syncs a step makes.

    python bench/profile_step.py [--device cuda] [--model paper] [--cuda-graphs] [--steps 10]

Writes ``bench/results/profile_step-<arm>.txt`` (the tables) and prints one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_step import build, one_step, sync  # noqa: E402

from common.privacy.sanitizer import noise_generator  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="paper")
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--critic-fakes", default="fresh")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    ns = argparse.Namespace(
        model=args.model, device=args.device, clients=4, batch=32, n_critic=5, critic_fakes=args.critic_fakes
    )
    cfg, server, clients = build(ns, args.cuda_graphs)
    noise = noise_generator(None)
    for i in range(5):
        one_step(cfg, server, clients[i % len(clients)], noise)
    sync(server.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if server.device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(args.steps):
            one_step(cfg, server, clients[i % len(clients)], noise)
        sync(server.device)
    wall_ms = 1000 * (time.perf_counter() - start) / args.steps
    events = prof.key_averages()
    sort = "cuda_time_total" if server.device.type == "cuda" else "cpu_time_total"
    syncs = sum(
        e.count for e in events if "Synchronize" in e.key or e.key in ("aten::item", "aten::_local_scalar_dense")
    )
    memcpy = sum(e.count for e in events if "Memcpy" in e.key)
    arm = "graphs" if args.cuda_graphs else "eager"
    text = "\n\n".join(
        [
            f"{arm}: {wall_ms:.1f} ms/step (profiled), {syncs / args.steps:.1f} syncs/step, "
            f"{memcpy / args.steps:.1f} memcpy/step",
            events.table(sort_by=sort, row_limit=30),
            events.table(sort_by="self_cpu_time_total", row_limit=20),
        ]
    )
    out = Path(args.out or ROOT / "bench" / "results" / f"profile_step-{arm}.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"profile_step: {text.splitlines()[0]} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
