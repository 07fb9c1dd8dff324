"""The ServerApp. ``app`` serves ``flwr run .`` (config from Flower's run_config); ``make_server_app``
serves ``fedgan simulate`` (config already resolved by the CLI, run directory chosen up front).

A run that does not complete raises, so Flower marks the run as failed rather than finished.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from common.methods import ExperimentConfig

from .reporting import FAILURE_FILE, RunDirectory, RunDirectoryError
from .seeded import run_configured
from .summary import print_summary
from .transport import FlowerTransport, RuntimeClock


@dataclass
class RunResult:
    """Filled by the ServerApp thread so the CLI can report and choose its exit code."""

    summary: dict[str, Any] | None = None
    error: BaseException | None = None


class RunIncomplete(RuntimeError):
    """The run stopped before its planned steps (budgets exhausted, clients failed, interrupted)."""


def make_server_app(
    server_fn: Callable[[FlowerTransport], Any],
    result: RunResult,
    *,
    on_pushed: Callable[[list[int]], None] | None = None,
    reply_timeout_s: float = 300.0,
    clock: RuntimeClock | None = None,
) -> ServerApp:
    """A ServerApp that runs ``server_fn`` on the grid's transport and hands back its result.

    Used by ``fedgan simulate`` and ``fedgan debug-task``, whose configuration is resolved before
    Flower starts; exceptions are kept in ``result`` for the CLI to report with its exit code.
    ``on_pushed`` is handed to the transport (the simulation runtime's wake-up after each push), and
    ``reply_timeout_s`` (the run's ``--reply-timeout-s``) bounds each wait for a reply, from when the
    ClientApp started on it where ``clock`` (the simulation runtime's) says.
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        logging.getLogger("flwr").setLevel(logging.WARNING)
        try:
            result.summary = server_fn(
                FlowerTransport(grid, timeout_s=reply_timeout_s, on_pushed=on_pushed, clock=clock)
            )
        except BaseException as err:  # handed to the CLI, which reports it and exits non-zero
            result.error = err

    return server_app


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run .``: every ExperimentConfig field is a run_config key."""
    from common.methods import prepare

    cfg = ExperimentConfig.from_run_config(context.run_config)
    try:
        cfg = prepare(cfg)
        run = RunDirectory.create(cfg)
    except Exception as err:
        _record_early_failure(cfg, err)  # before the run directory exists: still tell whoever started it
        raise
    run.lock()
    control = FlowerTransport(grid, timeout_s=cfg.reply_timeout_s)
    try:
        if cfg.dataplane == "flower":
            summary = run_configured(cfg, run, control, transport_name="flower-run")
        else:
            from .dataplane import GrpcTransport, settings_from

            transport = GrpcTransport(control, context.run_id, settings_from(cfg))
            try:
                summary = run_configured(cfg, run, transport, transport_name="flower-run+grpc-dataplane")
            finally:
                transport.close()
    except Exception as err:
        # Whoever started the run (`fedgan deploy`, a user reading the run directory) learns why
        # without digging through `flwr log`: e.g. which node's privacy policy refused the run.
        with contextlib.suppress(RunDirectoryError):  # a full disk: the error itself still reaches Flower
            run.write_text(FAILURE_FILE, f"{type(err).__name__}: {err}\n")
        raise
    print_summary(summary)
    if summary["status"] != "completed":
        raise RunIncomplete(f"run {run.path} did not complete: {summary['status']}")


def _record_early_failure(cfg: ExperimentConfig, err: Exception) -> None:
    """``failure.txt`` in ``--out`` for a run that failed before its directory was made (bad data,
    a device that is not there), unless that directory already holds something else."""
    if not cfg.out:
        return
    from pathlib import Path

    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / FAILURE_FILE).exists() and not any(p.name not in ("deploy",) for p in out.iterdir()):
            (out / FAILURE_FILE).write_text(f"{type(err).__name__}: {err}\n")
    except OSError:
        pass
