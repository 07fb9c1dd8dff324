"""``fedgan simulate``: one SuperNode per client in Flower's simulation runtime, or in-process."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from common.channels import channel_for
from common.methods import ExperimentConfig
from common.secagg.identity import provision_simulated
from server.reporting import RunDirectory

T = TypeVar("T")
EXIT_COMPLETED, EXIT_STOPPED, EXIT_INTERRUPTED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 3, 130, 1, 2


def simulate(cfg: ExperimentConfig, run: RunDirectory, *, resume: bool, transport: str = "flower") -> int:
    """Run ``cfg`` and print the summary table; the exit code says whether the run completed."""
    from server.summary import print_summary

    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        runner = _run_inprocess if transport == "inprocess" else _run_flower
        summary, error = runner(cfg, run, resume, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if error is not None:
        from server.session import NodeRefused

        if isinstance(error, NodeRefused):  # nothing was released: the configuration is the problem
            print(f"fedgan: error: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if os.environ.get("FEDGAN_TRACEBACK"):
            traceback.print_exception(error)
        print(f"fedgan: the run failed: {_reason(error)}", file=sys.stderr)
        print(checkpoint_note(run), file=sys.stderr)
        return EXIT_FAILED
    print_summary(summary)
    if summary["status"] == "completed":
        return evaluate_at_end(cfg, run) if cfg.eval else EXIT_COMPLETED
    print(f"fedgan: run not completed: {summary['status']} (resume with --resume {run.path})", file=sys.stderr)
    # a seeded run interrupted in its seed stage reads "seed stage: interrupted"
    return EXIT_INTERRUPTED if summary["status"].endswith("interrupted") else EXIT_STOPPED


def _reason(error: BaseException) -> str:
    """The error in a line; a run directory's own errors need no type name, they say what failed."""
    from server.reporting import RunDirectoryError

    return str(error) if isinstance(error, RunDirectoryError) else f"{type(error).__name__}: {error}"


def checkpoint_note(run: RunDirectory) -> str:
    """What is left to resume after a failed run: the checkpoint, or why there is none."""
    from server.reporting import CHECKPOINT

    if (run.path / CHECKPOINT).is_file():
        return f"run directory (checkpoint kept; once the cause is fixed, --resume {run.path}): {run.path}"
    return f"run directory (no checkpoint was written, nothing to resume; start again with another --out): {run.path}"


def evaluate_at_end(cfg: ExperimentConfig, run: RunDirectory) -> int:
    """The run completed; evaluate its generator (a failure here leaves the run intact)."""
    from .evaluate import evaluate_run, print_eval

    try:
        result = evaluate_run(run.path, progress=cfg.progress)
    except Exception as err:  # noqa: BLE001 - the run is done; say what failed and how to retry
        print(
            f"fedgan: evaluation failed: {type(err).__name__}: {err}\n"
            f"the run is complete; retry with `fedgan evaluate {run.path}`",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print_eval(result)
    print(f"report: {run.path / 'report.html'}", flush=True)
    return EXIT_COMPLETED


def _run_inprocess(cfg: ExperimentConfig, run: RunDirectory, resume: bool, stop: threading.Event | None = None):
    server_fn = _experiment_fn(cfg, run, resume, stop, "inprocess")
    return run_on_transport(
        cfg.num_clients, server_fn, "inprocess", node_state=run.state_dir, secure=channel_for(cfg).sums
    )


def _run_flower(cfg: ExperimentConfig, run: RunDirectory, resume: bool, stop: threading.Event | None = None):
    server_fn = _experiment_fn(cfg, run, resume, stop, "flower-simulation")
    return run_on_transport(
        cfg.num_clients,
        server_fn,
        "flower",
        reply_timeout_s=cfg.reply_timeout_s,
        parallel=cfg.parallel_clients,
        node_state=run.state_dir,
        ray=RayPlacement.of(cfg),
        secure=channel_for(cfg).sums,
    )


def _experiment_fn(cfg, run, resume, stop, name):
    from server.seeded import run_configured  # a seeded run: both stages on the one transport

    return lambda transport: run_configured(cfg, run, transport, resume=resume, transport_name=name, stop=stop)


def run_on_transport(
    num_clients: int,
    server_fn: Callable[[Any], T],
    transport: str,
    *,
    reply_timeout_s: float = 300.0,
    client_app: Any = None,
    parallel: int = 1,
    node_state: str | Path | None = None,
    ray: RayPlacement | None = None,
    secure: bool = False,
) -> tuple[T | None, BaseException | None]:
    """Run ``server_fn(transport)`` with ``num_clients`` clients: in Flower's simulation runtime
    (one SuperNode per client; a client silent for ``reply_timeout_s`` once its ClientApp started is
    marked failed, the clients queued behind it for an actor are not; ``parallel``
    ClientApp actors) or by calling the ClientApp in-process. Returns (result, error).
    ``client_app``: the project's unless a test passes another. ``node_state``: where the simulated
    nodes keep their state and their own privacy ledgers (``FEDGAN_NODE_STATE``, as the operator of
    real nodes sets their node config's ``state-dir``); the server never tells a node where.
    ``ray``: the Ray instance Flower's simulation runs on (default: a fresh local one of our own).
    ``secure``: the run releases through secure sums: the simulated nodes get identities in
    ``node_state`` and the server the published keys (``common/secagg/identity.py``), as an operator
    provisions real nodes, so each node verifies its peers."""
    from common.privacy.node_ledger import NODE_STATE_ENV

    from ..env import restored_env

    if secure and node_state is not None:
        server_fn = _with_peers(server_fn, provision_simulated(node_state, num_clients))

    # FEDGAN_NODE_STATE for this run's simulated nodes (a local Ray's actors inherit it, a cluster's get it
    # in the run's runtime_env: ray_cluster.actor_env), restored after
    with restored_env(NODE_STATE_ENV, None if node_state is None else str(Path(node_state).resolve())):
        return _run_on_transport(
            num_clients, server_fn, transport, reply_timeout_s, client_app, parallel, ray or RayPlacement()
        )


def _with_peers(server_fn: Callable[[Any], T], peers: frozenset[bytes]) -> Callable[[Any], T]:
    """``server_fn`` on a transport that carries the federation's published identities."""

    def with_peers(transport: Any) -> T:
        transport.secagg_peers = peers
        return server_fn(transport)

    return with_peers


def _run_on_transport(num_clients, server_fn, transport, reply_timeout_s, client_app, parallel, ray):
    batch_handlers = None
    if client_app is None:
        from client.app import BATCH_HANDLERS as batch_handlers
        from client.app import app as client_app

    if transport == "inprocess":
        from server.transport import InProcessTransport

        try:
            return server_fn(InProcessTransport(client_app, num_clients, batch_handlers=batch_handlers)), None
        except Exception as err:  # noqa: BLE001 - reported with its type and message
            return None, err
    from flwr.simulation import run_simulation

    from server.app import RunResult, make_server_app

    from .flower_tuning import clocked_client_apps, prompt_message_delivery, run_client_actors_at_normal_priority
    from .ray_cluster import ray_backend

    _quiet_flower()
    run_client_actors_at_normal_priority()
    result = RunResult()
    try:
        with (
            ray_backend(ray.address, ray.actor_cpus, parallel) as backend,
            prompt_message_delivery() as on_pushed,
            clocked_client_apps() as clock,
        ):
            run_simulation(
                server_app=make_server_app(
                    server_fn, result, on_pushed=on_pushed, reply_timeout_s=reply_timeout_s, clock=clock
                ),
                client_app=client_app,
                num_supernodes=num_clients,
                backend_config=backend,
            )
    except Exception as err:  # noqa: BLE001
        result.error = result.error or err
    return result.summary, result.error


@dataclass(frozen=True)
class RayPlacement:
    """The Ray instance Flower's simulation runs its ClientApp actors on (``ray_cluster.py``): a fresh
    local one of our own (``address`` empty) or an existing cluster; ``actor_cpus``: cores per actor
    (0: automatic)."""

    address: str = ""
    actor_cpus: int = 0

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> RayPlacement:
        return cls(cfg.ray_address, cfg.ray_actor_cpus)


def actor_cpus(cpus: int, parallel: int) -> int:
    """Cores each ClientApp actor reserves on a local instance of ``cpus`` cores when ray_actor_cpus is
    automatic: Ray runs cpus // that many actors at once, so ``parallel`` clients of one step compute
    side by side (at most one per core). Ray also sets each actor's OMP_NUM_THREADS to its cores
    (unless the user set it), which ``client.node.client_threads`` reads."""
    from .ray_cluster import actor_cpus_for

    return actor_cpus_for([cpus], 0, parallel)


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
    from client.quiet import quiet_known_notices

    quiet_known_notices()
