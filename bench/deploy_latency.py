"""Step latency and bytes of one configuration: Flower's simulation, and local deployments through
Flower's message path and through the project's gRPC data plane.

Runs ``fedgan simulate`` (Flower's simulation runtime), ``fedgan deploy --local --transport flower``
and ``fedgan deploy --local --transport grpc`` (SuperLink and SuperNodes as processes) on the same
configuration and seed, one after the other, and reads the run directories: median / p90 wall time
per generator step (``step_latency_s``), CT (bytes per step per participating client), per-client
bytes and ε, and the deployments' SuperLink counters. Writes ``bench/results/deploy_latency.json``
and prints one line.

    python bench/deploy_latency.py [--steps 30] [--flower-steps 8] [--num-clients 3] [--model small] [--tls]
                                   [--compose]

``--compose`` adds the Docker Compose deployment (plain file, then the TLS overlay; both through the
data plane) on a Docker engine started for the benchmark with images built offline, as the compose
test does (deploy/offline/; needs root). ``--num-clients`` must then be NUM_CLIENTS of ``.env``.
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


def settings(args: argparse.Namespace, steps: int) -> dict[str, object]:
    """The one configuration every arm runs (ExperimentConfig field names)."""
    return dict(
        num_clients=args.num_clients, steps=steps, model=args.model, wire_compression="none", sampling_seed=1,
        batch_size=32, n_critic=5, eval=False, progress=False, sample_every=1000000,
    )  # fmt: skip


def arm(summary: dict, deployment: object) -> dict:
    """What the benchmark keeps of one run's summary.json."""
    keys = ("client_id", "queries", "epsilon", "bytes_down", "bytes_up")
    return {
        "step_latency_s": summary["step_latency_s"],
        "bytes_per_step": summary["comm"]["bytes_per_step"],
        "clients": [{k: c[k] for k in keys} for c in summary["clients"]],
        "deployment": deployment,
    }


def run(command: str, out: Path, args: argparse.Namespace, extra: list[str], steps: int) -> dict:
    from simulations.cli import config_flags

    argv = [str(BIN / "fedgan"), command, *extra, *config_flags(**settings(args, steps)), "--out", str(out)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{command} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return arm(summary, summary.get("deployment"))


def compose_arms(args: argparse.Namespace, tmp: Path) -> dict[str, dict]:
    """The same configuration through the compose deployment: plain file, then TLS overlay."""
    import os

    from simulations.deploy.compose_run import ComposeDeployment, build_images, start_engine, stop_engine

    state = Path(tempfile.mkdtemp(prefix="fedgan-bench-dockerd-", dir="/tmp"))
    env = start_engine(state, dict(os.environ))
    arms = {}
    try:
        build_images(env)
        deployment = ComposeDeployment(tmp / "compose", env)
        try:
            for tls in (False, True):
                deployment.up(tls=tls)
                summary = deployment.flwr_run("tls" if tls else "plain", **settings(args, args.steps))
                deployment.down()
                status = {"flwr_status": summary["flwr_status"], "transport": summary["transport"]}
                arms["compose_tls" if tls else "compose_plain"] = arm(summary, status)
        finally:
            deployment.down()
    finally:
        stop_engine(state, env)
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="steps of the simulation and the gRPC deployment")
    parser.add_argument("--flower-steps", type=int, default=8, help="steps through Flower's messages (~10 s each)")
    parser.add_argument("--num-clients", type=int, default=3)
    parser.add_argument("--model", default="small")
    parser.add_argument("--tls", action="store_true", help="deploy with TLS and SuperNode authentication")
    parser.add_argument("--compose", action="store_true", help="also the Docker Compose deployment, plain and TLS")
    args = parser.parse_args()
    secure = ["--tls", "--auth"] if args.tls else []
    with tempfile.TemporaryDirectory() as tmp:
        arms = {
            "simulation": run("simulate", Path(tmp) / "sim", args, [], args.steps),
            "deploy_grpc": run(
                "deploy", Path(tmp) / "grpc", args, ["--local", "--transport", "grpc", *secure], args.steps
            ),
            "deploy_flower": run(
                "deploy", Path(tmp) / "flower", args, ["--local", "--transport", "flower", *secure], args.flower_steps
            ),
        }
        if args.compose:
            arms.update(compose_arms(args, Path(tmp)))
    median = {k: v["step_latency_s"]["median"] for k, v in arms.items()}
    # CT does not depend on which clients answered with fixed-size encodings: it must be equal.
    same = len({a["bytes_per_step"]["total"] for a in arms.values()}) == 1
    result = {"config": vars(args), "arms": arms, "median_step_s": median, "per_step_bytes_equal": same}
    out = ROOT / "bench" / "results" / "deploy_latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    ct = {k: v["bytes_per_step"]["total"] for k, v in arms.items()}
    compose = (
        f", compose plain {median['compose_plain']:.3f} s, compose TLS {median['compose_tls']:.3f} s"
        if args.compose
        else ""
    )
    print(
        f"median step: simulation {median['simulation']:.3f} s, deploy gRPC data plane {median['deploy_grpc']:.3f} s, "
        f"deploy Flower messages {median['deploy_flower']:.2f} s{compose}; CT {ct['simulation']:,.0f} / "
        f"{ct['deploy_grpc']:,.0f} / {ct['deploy_flower']:,.0f} B; bytes per step equal: {same} -> {out}"
    )


if __name__ == "__main__":
    main()
