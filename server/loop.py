"""The one round loop. A method fills hooks (through ``strategy.py``); this file owns the steps, bytes,
logs and checkpoints.

Every method runs through ``run_experiment``: the session's hello (``session.py``), the rounds,
the ledger fetch, then summary.json and privacy.json (``summary.py``). A step only counts when the
strategy says the generator moved; clients that refuse (budget) or fail (error, timeout, malformed
answer) are not asked again, and the run stops cleanly, with a checkpoint and a summary, when
nobody is left to ask.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tqdm import tqdm

from common.comm import CommCounter
from common.data import num_classes_for
from common.io.progress import progress_bar
from common.methods import ExperimentConfig
from common.privacy.statement import public_data_sentence

from .loop_lines import bounded, repeat_notes, repeated, status_line
from .method_sums import count_bytes, run_method_sums
from .release import write_release
from .reporting import RunDirectory, RunDirectoryError
from .session import NodeRefused, Transport, fetch_ledgers, greet
from .strategy import PriorReleases, Strategy, build_strategy
from .summary import RunFacts, epsilon_stats, privacy_document, summary_document

__all__ = ["NodeRefused", "run_experiment"]


@dataclass
class LoopState:
    step: int = 0
    wall_s: float = 0.0
    prior_wall_s: float = 0.0  # spent before this run on what it starts from (``PriorReleases.wall_s``)
    comm: CommCounter = field(default_factory=CommCounter)
    exhausted: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    last_metrics: dict[str, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)  # wall seconds of each generator step
    failures: dict[int, str] = field(default_factory=dict)  # client id -> why it was dropped
    progress_at: float = 0.0
    # Clients whose ledger the hello found not empty (or could not rule out); None: not known.
    ledger_holders: frozenset[int] | None = None
    # A note's shape (digits masked) -> [times seen, its first wording]: the same note for the 290th
    # client is counted, not printed (a --target-epsilon run's budget refusals).
    repeats: dict[str, list] = field(default_factory=dict)
    # The first write to the run directory that failed (a full or read-only disk): the run stops,
    # still fetches the ledgers and writes privacy.json if it can, then raises it.
    write_error: RunDirectoryError | None = None
    status: Callable[[str], None] = field(default=lambda text: None, repr=False)  # what the step is doing now


def run_experiment(
    cfg: ExperimentConfig,
    run: RunDirectory,
    transport: Transport,
    *,
    resume: bool = False,
    transport_name: str = "flower-simulation",
    stop: threading.Event | None = None,
    prior: PriorReleases | None = None,
) -> dict[str, Any]:
    """Run (or continue) ``cfg`` in ``run``; returns summary.json's content.

    ``stop`` lets another thread (the CLI's Ctrl-C handler when the loop runs in Flower's server
    thread) end the run after the current step, with a checkpoint and a summary. ``prior`` holds
    releases made before the run that its generator depends on (the debugging task's selection).
    """
    strategy = build_strategy(cfg, num_classes_for(cfg), prior)
    state = _restore(run, strategy) if resume else LoopState()
    state.prior_wall_s = prior.wall_s if prior is not None else 0.0
    nodes = transport.node_ids(cfg.num_clients)
    if len(nodes) != cfg.num_clients:
        raise RuntimeError(f"the federation has {len(nodes)} nodes but num_clients={cfg.num_clients}")
    state.comm.add_control(*transport.setup_totals)  # a data plane's kick-off messages
    nodes, greeting = greet(cfg, transport, strategy, nodes)
    state.ledger_holders = greeting.ledger_holders
    state.comm.add_control(greeting.bytes_down, greeting.bytes_up)
    allowed = set(cfg.participants())
    nodes = [n for n in nodes if strategy.node_client[n] in allowed]
    if not resume:  # before any release: whatever fails later, the run can be resumed from here
        _first_checkpoint(run, strategy, state)
    status = _train(cfg, run, transport, strategy, state, nodes, stop or threading.Event())
    queried = {cid for cid, sent in state.comm.down.items() if sent > 0}
    notes, cost = fetch_ledgers(
        cfg, transport, strategy, failed=state.failed, queried=queried, holders=state.ledger_holders
    )
    state.notes.extend(notes)
    state.comm.add_control(*cost)
    return _finish_or_raise(cfg, run, strategy, state, status, transport_name)


def _first_checkpoint(run: RunDirectory, strategy: Strategy, state: LoopState) -> None:
    try:
        _checkpoint(run, strategy, state)
    except RunDirectoryError as err:
        raise RunDirectoryError(
            f"{err}: the run stopped before any client released anything; start it again with another --out"
        ) from err


def _restore(run: RunDirectory, strategy: Strategy) -> LoopState:
    ck = run.resumable_checkpoint()
    try:
        strategy.load_state_dict(ck["strategy"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise RunDirectoryError(
            f"{run.path / 'checkpoint.pt'} does not fit this run ({type(err).__name__}: {str(err)[:200]}): "
            "it cannot be resumed"
        ) from err
    run.truncate_metrics(ck["step"])
    return LoopState(
        step=ck["step"],
        wall_s=ck["wall_s"],
        comm=CommCounter.from_state_dict(ck["comm"]),
        notes=list(ck.get("notes", [])),
        step_times=list(ck.get("step_times", [])),
        failures={int(k): v for k, v in ck.get("failures", {}).items()},
    )


def _train(
    cfg: ExperimentConfig,
    run: RunDirectory,
    transport: Transport,
    strategy: Strategy,
    state: LoopState,
    nodes: list[int],
    stop: threading.Event,
) -> str:
    started = time.monotonic()
    base_wall = state.wall_s
    status = "completed"
    bar = progress_bar(
        total=cfg.steps,
        initial=state.step,
        disable=not cfg.progress,
        unit="step",
        desc=f"{cfg.strategy} steps",
        dynamic_ncols=True,
    )
    state.status = status_line(bar)
    # Rebuilt only when a node drops out: scanning all K nodes every step cost 3 ms at K = 10^5.
    available, dropped, step_started = nodes, -1, None
    try:
        while state.step < cfg.steps:
            if stop.is_set():
                status = "interrupted"
                break
            if len(state.exhausted) + len(state.failed) != dropped:  # both sets only grow
                available = [n for n in nodes if n not in state.exhausted and n not in state.failed]
                dropped = len(state.exhausted) + len(state.failed)
            if not available:
                status = "stopped: no client can answer (budgets exhausted or clients failed)"
                break
            step_started = step_started or time.monotonic()  # a step may take rounds (DP-MERF's collection)
            took_step, asked = _round(cfg, transport, strategy, state, available)
            if not took_step and not asked:  # the strategy needs a client that is gone (DPGAN's curator)
                status = "stopped: no client can answer (budgets exhausted or clients failed)"
                break
            if took_step:
                state.step += 1
                state.step_times.append(time.monotonic() - step_started)
                step_started = None
                bar.update(1)
                state.wall_s = base_wall + time.monotonic() - started
                _periodic(cfg, run, strategy, state, bar)
            _report_progress(cfg, run, state)
    except KeyboardInterrupt:
        status = "interrupted"
    except RunDirectoryError as err:  # a full or read-only disk: stop here, keep what is written
        state.write_error = err
    finally:
        bar.close()
        state.wall_s = base_wall + time.monotonic() - started
        _save_at_end(cfg, run, strategy, state)
    return f"failed: {state.write_error}" if state.write_error else status


def _save_at_end(cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState) -> None:
    """The last checkpoint and progress.json. After a failed write this is tried once more (removing
    the failed temporary file may have made room); a failure is kept in ``state``, the first one wins."""
    try:
        _checkpoint(run, strategy, state)
        _report_progress(cfg, run, state, final=True)
    except RunDirectoryError as err:
        state.write_error = state.write_error or err


def _report_progress(cfg: ExperimentConfig, run: RunDirectory, state: LoopState, *, final: bool = False) -> None:
    """progress.json, at most once a second: how ``fedgan deploy`` follows a run in another process."""
    now = time.monotonic()
    if final or now - state.progress_at >= 1.0:
        state.progress_at = now
        run.write_json(
            "progress.json", {"step": state.step, "steps": cfg.steps, "wall_s": round(state.wall_s, 3), "final": final}
        )


def _round(
    cfg: ExperimentConfig, transport: Transport, strategy: Strategy, state: LoopState, available: list[int]
) -> tuple[bool, bool]:
    """One round; (whether the generator moved, whether any client was asked)."""
    step, count = state.step, partial(count_bytes, strategy.node_client, state.comm)
    selected = strategy.select_nodes(available)
    exchange = transport.exchange(strategy.configure_step(step, selected))
    outcome = strategy.aggregate_step(step, exchange.replies)
    count(exchange)
    run_method_sums(transport, strategy, step, outcome, count, cfg.reply_timeout_s, state.status)  # secure sums
    if outcome.took_step or outcome.more:
        answered = len(selected) - len(outcome.exhausted_nodes) - len(outcome.failed_nodes)
        state.comm.count_participation(answered)
    if outcome.took_step:
        state.last_metrics = outcome.metrics
    state.exhausted.update(outcome.exhausted_nodes)
    state.failed.update(outcome.failed_nodes)
    errors = {r.node_id: bounded(r.error) for r in exchange.replies if r.error}
    for node in outcome.failed_nodes:
        reason = errors.get(node) or outcome.failure_reasons.get(node) or "malformed answer (see notes)"
        state.failures[_client_key(strategy, node)] = f"step {step}: {reason}"
    for note in outcome.notes:
        note = bounded(note)  # a note may quote a client's words: never let one flood the log or checkpoint
        if repeated(state.repeats, note):
            continue
        tqdm.write(f"[step {step}] {note}")
        state.notes.append(f"step {step}: {note}")
    return outcome.took_step, bool(selected)


def _client_key(strategy: Strategy, node: int) -> int:
    """Bytes are reported per client (partition) id; -1 stands for a node that never identified."""
    return strategy.node_client.get(node, -1)


def _periodic(cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState, bar: tqdm) -> None:
    step = state.step
    if step % cfg.log_every == 0 or step == cfg.steps:
        record = _metrics_record(strategy, state)
        run.append_metrics(record)
        eps_max = record["privacy/epsilon_max"]
        postfix = {"eps_max": "unbounded" if eps_max is None else f"{eps_max:.3g}"}
        for label, key in strategy.side.progress_metrics.items():  # the method's, when the step had them
            if key in record:
                postfix[label] = f"{record[key]:.3g}"
        bar.set_postfix(postfix, refresh=False)  # drawn at the next throttled update
    if step % cfg.sample_every == 0 or step == cfg.steps:
        run.save_samples(strategy.released_generator(), step, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim)
    if step % cfg.checkpoint_every == 0:
        _checkpoint(run, strategy, state)
    if cfg.eval_every and step % cfg.eval_every == 0:
        _snapshot(run, strategy, state)


def _snapshot(run: RunDirectory, strategy: Strategy, state: LoopState) -> None:
    """Keep the released generator and the privacy spent so far, for ε-vs-quality curves."""
    report = strategy.privacy_report()
    eps_max, eps_median = epsilon_stats(report)
    run.save_snapshot(
        state.step,
        strategy.released_generator().state_dict(),
        {
            "epsilon_max": eps_max,
            "epsilon_median": eps_median,
            "epsilon_amplified": report["epsilon_amplified"]["epsilon"],
        },
    )


def _metrics_record(strategy: Strategy, state: LoopState) -> dict[str, Any]:
    report = strategy.privacy_report()
    eps_max, eps_median = epsilon_stats(report)
    per_step = state.comm.per_step()
    return {
        "step": state.step,
        "time_s": round(state.wall_s, 3),
        **state.last_metrics,
        "privacy/epsilon_max": eps_max,
        "privacy/epsilon_median": eps_median,
        "privacy/epsilon_amplified": report["epsilon_amplified"]["epsilon"],
        "privacy/clients_queried": sum(c["queries"] > 0 for c in report["clients"]),
        "comm/bytes_down": state.comm.down_total,
        "comm/bytes_up": state.comm.up_total,
        "comm/bytes_per_step_down": per_step["down"],
        "comm/bytes_per_step_up": per_step["up"],
    }


def _checkpoint(run: RunDirectory, strategy: Strategy, state: LoopState) -> None:
    run.save_checkpoint(
        {
            "step": state.step,
            "wall_s": state.wall_s,
            "strategy": strategy.state_dict(),
            # Strategy-independent copy of what is released, for `fedgan evaluate`.
            "released_generator": strategy.released_generator().state_dict(),
            "comm": state.comm.state_dict(),
            "notes": state.notes,
            "step_times": state.step_times,
            "failures": state.failures,
        }
    )


def _finish_or_raise(
    cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState, status: str, transport_name: str
) -> dict[str, Any]:
    """``_finish``; after a failed write, its RunDirectoryError once privacy.json is written. When a
    report cannot be written, an older one left by an earlier part of the run (whose ε would
    understate what the clients spent since) is removed, and the error says so."""
    before = _report_stamps(run)
    try:
        summary = _finish(cfg, run, strategy, state, status, transport_name)
    except RunDirectoryError as err:
        stale = [name for name, stamp in before.items() if stamp is not None and _report_stamps(run)[name] == stamp]
        for name in stale:
            with contextlib.suppress(OSError):
                (run.path / name).unlink()
        removed = f"; the older {' and '.join(stale)} (which would understate it) removed" if stale else ""
        first = f"{state.write_error}; then " if state.write_error else ""
        raise RunDirectoryError(
            f"{first}{err}{removed}: the clients' ledgers in {run.state_dir} hold what they spent"
        ) from err
    if state.write_error is not None:
        raise state.write_error
    return summary


REPORTS = ("privacy.json", "summary.json")


def _report_stamps(run: RunDirectory) -> dict[str, int | None]:
    """Each report's modification time (ns), None when absent: a rewritten report has a new one."""
    stamps: dict[str, int | None] = {}
    for name in REPORTS:
        try:
            stamps[name] = (run.path / name).stat().st_mtime_ns
        except OSError:
            stamps[name] = None
    return stamps


def _finish(
    cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState, status: str, transport_name: str
) -> dict[str, Any]:
    """privacy.json, summary.json (returned), the last sample grid."""
    for line in repeat_notes(state.repeats):
        tqdm.write(line)
        state.notes.append(line)
    state.repeats.clear()
    report = strategy.privacy_report(final=True)
    if cfg.public_data and report.get("statement"):  # what the user declared public, whatever the method
        report["statement"] += " " + public_data_sentence(cfg)
    run.write_json("privacy.json", privacy_document(cfg, report))
    facts = RunFacts(
        status=status,
        transport=transport_name,
        steps_completed=state.step,
        comm=state.comm.summary(),
        wall_s=state.wall_s,
        prior_wall_s=state.prior_wall_s,
        step_times=state.step_times,
        failures=state.failures,
        notes=state.notes,
        run_dir=str(run.path),
        bytes_down=dict(state.comm.down),
        bytes_up=dict(state.comm.up),
    )
    summary = summary_document(cfg, report, facts)
    run.write_json("summary.json", summary)
    if state.step > 0 and state.write_error is None:  # after the reports: they matter more than a picture
        run.save_samples(strategy.released_generator(), state.step, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim)
    if state.write_error is None:  # what may be published, beside the operator's reports
        write_release(run, cfg, summary, report, strategy.released_generator())
    return summary
