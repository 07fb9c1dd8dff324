"""A run on a local deployment: submit it with ``flwr run``, follow it to ``finished:completed``,
add the deployment's byte figures to summary.json, evaluate; ``fedgan deploy --local`` end to end."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.data import data_root
from common.methods import ExperimentConfig

from .local import CONNECTION, LocalDeployment

SERVERAPP_LOG = "serverapp.log"  # in deploy/: the ServerApp's log, fetched before the SuperLink stops


def run_config_file(cfg: ExperimentConfig, path: Path) -> Path:
    """The whole configuration as a ``flwr run --run-config`` TOML file (every field a key)."""
    from simulations.devtools.flwr_config import toml_value

    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items()))
    return path


def deployment_report(
    summary: dict[str, Any], info: dict[str, Any], wire: tuple[int, int], dep: LocalDeployment, elapsed_s: float
) -> dict[str, Any]:
    """Our byte counts next to Flower's counters and the bytes on the wire, for the same run."""
    comm = summary["comm"]
    counted = (
        comm["bytes_down_total"] + comm["control_bytes_down_total"],
        comm["bytes_up_total"] + comm["control_bytes_up_total"],
    )
    traffic = info.get("network-traffic", {})
    flower = (int(traffic.get("outbound-bytes", 0)), int(traffic.get("inbound-bytes", 0)))
    return {
        "mode": "local",
        "flwr_run_id": info["run-id"],
        "flwr_status": info["status"],
        "supernodes": dep.num_nodes,
        "tls": dep.tls,
        "auth": dep.auth,
        "netns": dep.use_netns,
        "elapsed_s": round(elapsed_s, 3),
        "counted_bytes": {"down": counted[0], "up": counted[1]},
        "superlink_traffic_bytes": {"down": flower[0], "up": flower[1]},
        "fleet_overhead_bytes": {"down": flower[0] - counted[0], "up": flower[1] - counted[1]},
        "wire_bytes": {"down": wire[0], "up": wire[1]},
        "http_overhead_bytes": {"down": wire[0] - flower[0], "up": wire[1] - flower[1]},
        "definition": (
            "counted: our codec's serialized Flower messages (as in simulation, incl. control messages); "
            "superlink_traffic: Flower's per-run counters (`flwr list`), protobuf requests and responses "
            "of the Fleet API; wire: TCP payload between the SuperNodes and the SuperLink while the run "
            "was active (HTTP headers, TLS records, idle polls and heartbeats included). "
            "fleet_overhead = superlink_traffic - counted; http_overhead = wire - superlink_traffic. "
            "With the gRPC data plane (summary transport flower-run+grpc-dataplane) the per-step messages "
            "bypass the SuperLink: its counters and the wire see only Flower's control traffic, so the "
            "overheads are not meaningful there."
        ),
    }


def deploy_local(
    cfg: ExperimentConfig, *, tls: bool, auth: bool, use_netns: bool, node_policy: Path | None = None
) -> int:
    """Run ``cfg`` on a local deployment; same exit codes and run directory as ``fedgan simulate``.
    ``node_policy``: the privacy policy file every SuperNode pins (their node config)."""
    from server.reporting import DEPLOY_DIR, next_run_dir

    run_path = (Path(cfg.out) if cfg.out else next_run_dir("runs", cfg)).resolve()
    cfg = cfg.replace(out=str(run_path), data_dir=str(data_root(cfg.data_dir)))
    print(f"run directory: {run_path}", flush=True)
    with LocalDeployment(
        run_path / DEPLOY_DIR, cfg.num_clients, tls=tls, auth=auth, use_netns=use_netns, node_policy=node_policy
    ) as dep:
        print(
            f"SuperLink on {dep.server_host}:{dep.port} ({'TLS' if tls else 'insecure'}"
            f"{', SuperNode auth' if auth else ''}), {cfg.num_clients} SuperNodes"
            f"{' in network namespaces' if use_netns else ''}; logs in {dep.logs}",
            flush=True,
        )
        return run_on_deployment(dep, cfg)


def save_serverapp_log(dep: LocalDeployment, run_id: str, path: Path) -> tuple[Path | None, str]:
    """The ServerApp's log (``flwr log --show``) saved while the SuperLink still runs, and its last
    error line: once the deployment stops, `flwr log` cannot fetch it any more."""
    import subprocess

    try:
        done = subprocess.run(
            ["flwr", "log", run_id, CONNECTION, "--show"], env=dep.env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    text = done.stdout + done.stderr
    path.write_text(text)
    errors = [line.strip() for line in text.splitlines() if "Error" in line or "Exception" in line]
    return path, errors[-1][:500] if errors else ""


def run_on_deployment(dep: LocalDeployment, cfg: ExperimentConfig) -> int:
    """Submit ``cfg`` (absolute ``out`` and ``data_dir``) to a started deployment, follow it, add
    the deployment's byte figures to summary.json, evaluate; returns ``fedgan simulate``'s exit codes."""
    from server.reporting import RunDirectory, atomic_write_json
    from simulations.experiments.simulate import (
        EXIT_BAD_INPUT,
        EXIT_COMPLETED,
        EXIT_FAILED,
        EXIT_INTERRUPTED,
        EXIT_STOPPED,
    )

    run_path = Path(cfg.out)
    if cfg.dataplane == "grpc":
        cfg = cfg.replace(**dep.dataplane_settings())
    atomic_write_json(dep.workdir / "processes.json", dep.process_table())
    started = time.monotonic()
    run_id = dep.submit(run_config_file(cfg, dep.workdir / "run_config.toml"))
    wire_at_start = dep.wire_bytes()
    print(f"flwr run id: {run_id}", flush=True)
    try:
        info = _follow(dep, run_id, run_path, cfg)
    except KeyboardInterrupt:
        print("\nfedgan: stopping the run (flwr stop) and the deployment", file=sys.stderr)
        _quiet(lambda: dep.flwr("stop", run_id, CONNECTION, "--format", "json"))
        return EXIT_INTERRUPTED
    wire = tuple(a - b for a, b in zip(dep.wire_bytes(), wire_at_start, strict=False))
    # Kept whatever the outcome: once the deployment stops, `flwr log` cannot fetch it any more, and it
    # says where each data-plane worker connected from.
    log, last_error = save_serverapp_log(dep, run_id, dep.workdir / SERVERAPP_LOG)
    summary_path = run_path / "summary.json"
    if not summary_path.is_file():
        from server.reporting import FAILURE_FILE

        failure = run_path / FAILURE_FILE
        why = f": {failure.read_text().strip()}" if failure.is_file() else (f": {last_error}" if last_error else "")
        print(
            f"fedgan: the run ended as {info['status']} without a summary{why}\nServerApp log: "
            f"{log or f'`flwr log {run_id}` (while the SuperLink runs)'}; deployment logs in {dep.logs}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT if "NodeRefused" in why else EXIT_FAILED
    summary = json.loads(summary_path.read_text())
    summary["deployment"] = deployment_report(summary, info, wire, dep, time.monotonic() - started)
    atomic_write_json(summary_path, summary)
    atomic_write_json(dep.workdir / "deployment.json", summary["deployment"])
    from server.summary import print_summary

    print_summary(summary)
    print(format_deployment(summary["deployment"]), flush=True)
    if info["status"] != "finished:completed" or summary["status"] != "completed":
        print(f"fedgan: run not completed: {summary['status']} (Flower: {info['status']})", file=sys.stderr)
        return EXIT_STOPPED
    if cfg.eval:
        from simulations.experiments.simulate import evaluate_at_end

        return evaluate_at_end(cfg, RunDirectory(run_path))
    return EXIT_COMPLETED


def _follow(dep: LocalDeployment, run_id: str, run_path: Path, cfg: ExperimentConfig) -> dict[str, Any]:
    """Wait for the run, with a progress bar fed by the ServerApp's progress.json."""
    from common.io.progress import progress_bar

    bar = progress_bar(
        total=cfg.steps,
        disable=not cfg.progress,
        unit="step",
        desc=f"{cfg.strategy} steps (deployed)",
        dynamic_ncols=True,
    )

    def poll() -> bool:
        try:
            progress = json.loads((run_path / "progress.json").read_text())
        except (OSError, ValueError):
            return False
        bar.update(progress["step"] - bar.n)
        return bool(progress["final"])

    try:
        return dep.wait(run_id, poll=poll)
    finally:
        bar.close()


def _quiet(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - best effort while shutting down; say what failed
        print(f"fedgan: {err}", file=sys.stderr)


def format_deployment(d: dict[str, Any]) -> str:
    def row(name: str, key: str) -> str:
        return f"  {name:<28}{d[key]['down']:>14,}{d[key]['up']:>14,}"

    return "\n".join(
        [
            f"deployment: Flower run {d['flwr_run_id']} {d['flwr_status']}, {d['supernodes']} SuperNodes, "
            f"TLS {'on' if d['tls'] else 'off'}, auth {'on' if d['auth'] else 'off'}",
            f"  {'bytes':<28}{'down':>14}{'up':>14}",
            row("counted (codec, = simulation)", "counted_bytes"),
            row("SuperLink counters", "superlink_traffic_bytes"),
            row("on the wire (HTTP/TLS)", "wire_bytes"),
        ]
    )
