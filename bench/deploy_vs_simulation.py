"""Step latency and bytes of one configuration in Flower's simulation and in a local deployment.

Runs ``fedgan simulate`` (Flower's simulation runtime) and ``fedgan deploy --local`` (SuperLink and
SuperNodes as processes) on the same configuration and seed, one after the other, and reads both
run directories: median / p90 wall time per generator step (``step_latency_s``), CT (bytes per step
per participating client), and in the deployment the SuperLink's counters and the bytes on the
wire. Writes ``bench/results/deploy_vs_simulation.json`` and prints one line.

    python bench/deploy_vs_simulation.py [--steps 10] [--num-clients 3] [--model small] [--tls]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(command: str, out: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    argv = [str(BIN / "fedgan"), command, *extra, "--num-clients", str(args.num_clients), "--steps",
            str(args.steps), "--model", args.model, "--batch-size", "32", "--n-critic", "5", "--no-eval",
            "--no-progress", "--sample-every", "1000000", "--out", str(out)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{command} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"step_latency_s": summary["step_latency_s"], "bytes_per_step": summary["comm"]["bytes_per_step"],
            "clients": [{k: c[k] for k in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up")}
                        for c in summary["clients"]],
            "deployment": summary.get("deployment")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--num-clients", type=int, default=3)
    parser.add_argument("--model", default="small")
    parser.add_argument("--tls", action="store_true", help="deploy with TLS and SuperNode authentication")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sim = run("simulate", Path(tmp) / "sim", args, [])
        dep = run("deploy", Path(tmp) / "dep", args, ["--local"] + (["--tls", "--auth"] if args.tls else []))
    result = {"config": vars(args), "simulation": sim, "deployment": dep,
              "latency_ratio": dep["step_latency_s"]["median"] / sim["step_latency_s"]["median"],
              "same_client_bytes": sim["clients"] == dep["clients"]}
    out = ROOT / "bench" / "results" / "deploy_vs_simulation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    d = dep["deployment"]
    print(f"median step: simulation {sim['step_latency_s']['median']:.3f} s, deployment "
          f"{dep['step_latency_s']['median']:.2f} s ({result['latency_ratio']:.0f}x); CT "
          f"{sim['bytes_per_step']['total']:,.0f} B sim / {dep['bytes_per_step']['total']:,.0f} B deploy; "
          f"per-client bytes and eps identical: {result['same_client_bytes']}; SuperLink counters "
          f"{d['superlink_traffic_bytes']['down'] + d['superlink_traffic_bytes']['up']:,} B, wire "
          f"{d['wire_bytes']['down'] + d['wire_bytes']['up']:,} B vs counted "
          f"{d['counted_bytes']['down'] + d['counted_bytes']['up']:,} B -> {out}")


if __name__ == "__main__":
    main()
