"""``fedgan simulate``: one SuperNode per client in Flower's simulation runtime, or in-process."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings

from common.config import ExperimentConfig
from server.reporting import RunDirectory

EXIT_COMPLETED, EXIT_STOPPED, EXIT_INTERRUPTED, EXIT_FAILED = 0, 3, 130, 1


def simulate(cfg: ExperimentConfig, run: RunDirectory, *, resume: bool, transport: str = "flower") -> int:
    """Run ``cfg`` and print the summary table; the exit code says whether the run completed."""
    from server.loop import print_summary

    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        runner = _run_inprocess if transport == "inprocess" else _run_flower
        summary, error = runner(cfg, run, resume, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if error is not None:
        print(f"fedgan: the run failed: {type(error).__name__}: {error}", file=sys.stderr)
        print(f"run directory (checkpoint kept): {run.path}", file=sys.stderr)
        return EXIT_FAILED
    print_summary(summary)
    if summary["status"] == "completed":
        return EXIT_COMPLETED
    print(f"fedgan: run not completed: {summary['status']} (resume with --resume {run.path})", file=sys.stderr)
    return EXIT_INTERRUPTED if summary["status"] == "interrupted" else EXIT_STOPPED


def _run_inprocess(cfg: ExperimentConfig, run: RunDirectory, resume: bool,
                   stop: threading.Event | None = None):
    from client.app import app as client_app
    from server.loop import run_experiment
    from server.transport import InProcessTransport

    try:
        transport = InProcessTransport(client_app, cfg.num_clients)
        return run_experiment(cfg, run, transport, resume=resume, transport_name="inprocess", stop=stop), None
    except Exception as err:  # noqa: BLE001 - reported with its type and message
        return None, err


def _run_flower(cfg: ExperimentConfig, run: RunDirectory, resume: bool,
                stop: threading.Event | None = None):
    from flwr.simulation import run_simulation

    from client.app import app as client_app
    from server.app import RunResult, make_server_app

    _quiet_flower()
    result = RunResult()
    server_app = make_server_app(cfg, run, resume=resume, result=result, stop=stop)
    cpus = os.cpu_count() or 1
    backend = {"client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": True}}
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=cfg.num_clients,
                       backend_config=backend)
    except Exception as err:  # noqa: BLE001
        result.error = result.error or err
    return result.summary, result.error


def _stop_on_signals(stop: threading.Event) -> dict:
    """First Ctrl-C or SIGTERM: finish the current step, checkpoint, summarize. Second Ctrl-C: abort.

    The round loop runs in Flower's server thread, where KeyboardInterrupt never arrives, so the
    signal only sets an event that the loop checks between steps.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        print("\nfedgan: stopping after this step (Ctrl-C again to abort)", file=sys.stderr, flush=True)
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}


def _quiet_flower() -> None:
    """Flower and Ray are chatty; keep their warnings, drop their INFO lines and deprecation notes."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("flwr").setLevel(logging.WARNING)
