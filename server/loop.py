"""The one round loop. Strategies fill hooks; this file owns transport, bytes, logs, checkpoints, reports.

Every strategy (GS-WGAN here; DPGAN and Fed-Avg GAN plug in the same way) runs through
``run_experiment``. A step only counts when the strategy says the generator moved; clients that
refuse (budget) or fail (error, timeout, malformed answer) are not asked again, and the run stops
cleanly, with a checkpoint and a summary, when nobody is left to ask.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from client.flower_wire import decode_records, encode_records
from common.config import ExperimentConfig
from common.data import num_classes_for
from common.metrics import CommCounter
from common.privacy.statement import DO_NOT_PUBLISH

from .reporting import RunDirectory, format_summary_table
from .strategies import build_strategy
from .strategies.base import Incoming, Outgoing, PriorReleases, Strategy
from .transport import Exchange

MSG_HELLO = "query.hello"
# A node that failed during the run is still asked for its ledger at the end (it may have answered,
# and charged itself, after the server stopped waiting), but only this long: a dead node must not
# hold the report back by a whole reply timeout.
BEST_EFFORT_TIMEOUT_S = 30.0


class NodeRefused(RuntimeError):
    """A node's own privacy policy refuses the run's configuration; the message names it and why."""


class Transport(Protocol):
    def node_ids(self, expected: int) -> list[int]: ...

    def exchange(self, outgoing: list, *, timeout_s: float | None = None) -> Exchange: ...


@dataclass
class LoopState:
    step: int = 0
    wall_s: float = 0.0
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


def run_experiment(cfg: ExperimentConfig, run: RunDirectory, transport: Transport, *,
                   resume: bool = False, transport_name: str = "flower-simulation",
                   stop: threading.Event | None = None, prior: PriorReleases | None = None) -> dict[str, Any]:
    """Run (or continue) ``cfg`` in ``run``; returns summary.json's content.

    ``stop`` lets another thread (the CLI's Ctrl-C handler when the loop runs in Flower's server
    thread) end the run after the current step, with a checkpoint and a summary. ``prior`` holds
    releases made before the run that its generator depends on (the debugging task's selection).
    """
    strategy = build_strategy(cfg, num_classes_for(cfg), str(run.state_dir), prior)
    state = _restore(run, strategy) if resume else LoopState()
    nodes = transport.node_ids(cfg.num_clients)
    if len(nodes) != cfg.num_clients:
        raise RuntimeError(f"the federation has {len(nodes)} nodes but num_clients={cfg.num_clients}")
    state.comm.add_control(*getattr(transport, "setup_totals", (0, 0)))  # a data plane's kick-off messages
    nodes = _handshake(cfg, run, transport, strategy, state, nodes)
    allowed = set(cfg.participants())
    nodes = [n for n in nodes if strategy.node_client[n] in allowed]
    status = _train(cfg, run, transport, strategy, state, nodes, stop or threading.Event())
    _fetch_ledgers(cfg, transport, strategy, state)
    summary = _finish(cfg, run, strategy, state, status, transport_name)
    return summary


def handshake(cfg: ExperimentConfig, state_dir: str, transport: Transport,
              nodes: list[int]) -> tuple[dict[int, int], int, int]:
    """Send every node the run's config and state directory; learn its client id.

    Returns (node -> client id, bytes down, bytes up). Fails when the nodes do not hold exactly
    the partitions 0..num_clients-1.
    """
    hello = _hello(cfg, state_dir, transport, nodes)
    return hello.mapping, hello.bytes_down, hello.bytes_up


@dataclass
class Hello:
    """What the run's hello taught the server about its nodes."""

    mapping: dict[int, int]  # node -> client id
    ledger_holders: frozenset[int]  # clients whose ledger may hold releases (all that did not say it is empty)
    bytes_down: int
    bytes_up: int
    replies: list[Incoming] = field(default_factory=list)  # (a client with releases sends its ledger)


# One exchange carries at most this many messages. Flower 1.41's in-memory Grid checks every
# pending message id on each pull (InMemoryLinkState.get_message_res, every 2 ms here), so one
# exchange of K messages costs O(K) per poll. Measured with 3,400 simulated nodes: 14 s for the
# hellos in chunks of 128, 35 s in one exchange, once Flower's feeder no longer scans every node
# on each pass (while it does, that scan dominates and both take ~35 s); chunks of 16 are slower.
BROADCAST_CHUNK = 128


def _hello(cfg: ExperimentConfig, state_dir: str, transport: Transport, nodes: list[int]) -> Hello:
    """``handshake``, keeping what the replies say about the clients' ledgers.

    A reply may carry ``ledger_queries`` (queries already in the client's ledger when the run
    starts); ``_fetch_ledgers`` skips a client only on that word, so a ClientApp that does not
    send it keeps every client asked. A node whose privacy policy refuses the configuration says
    so here, and the run stops before any release (``NodeRefused``, naming each node and why).
    """
    setup = {"config": json.dumps(cfg.to_dict()), "state_dir": state_dir}
    exchange = _exchange_in_chunks(transport, [Outgoing(n, MSG_HELLO, encode_records({}, setup)) for n in nodes])
    mapping, holders, refusals = {}, set(), []
    for reply in exchange.replies:
        if reply.content is None:
            raise RuntimeError(f"node {reply.node_id} did not answer the run's hello: {reply.error}")
        scalars = decode_records(reply.content)[1]
        mapping[reply.node_id] = int(scalars["client_id"])
        if scalars.get("refused"):
            refusals.append(f"node {reply.node_id} (client {mapping[reply.node_id]}): {scalars.get('reason', '')}")
        if int(scalars.get("ledger_queries", 1)) > 0:  # not said: it may hold releases
            holders.add(mapping[reply.node_id])
    if refusals:
        more = f" (and {len(refusals) - 5} more)" if len(refusals) > 5 else ""
        raise NodeRefused(f"{len(refusals)} of {len(nodes)} nodes refuse this run under their own privacy "
                          f"policy: {'; '.join(refusals[:5])}{more}")
    if sorted(mapping.values()) != list(range(cfg.num_clients)):
        raise RuntimeError(f"nodes hold client ids {sorted(mapping.values())}, expected 0..{cfg.num_clients - 1}: "
                           "each node needs a distinct partition-id below num_clients")
    return Hello(mapping, frozenset(holders), *exchange.totals(), replies=exchange.replies)


def _exchange_in_chunks(transport: Transport, outgoing: list[Outgoing], *,
                        timeout_s: float | None = None) -> Exchange:
    """``transport.exchange`` of ``outgoing`` in pieces of ``BROADCAST_CHUNK`` messages, merged
    (``timeout_s``: wait at most this long for each piece's replies instead of the transport's own)."""
    step = BROADCAST_CHUNK
    kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
    parts = [transport.exchange(outgoing[i:i + step], **kwargs) for i in range(0, len(outgoing), step)]
    return Exchange(replies=[r for p in parts for r in p.replies],
                    bytes_down={n: b for p in parts for n, b in p.bytes_down.items()},
                    bytes_up={n: b for p in parts for n, b in p.bytes_up.items()})


def _handshake(cfg: ExperimentConfig, run: RunDirectory, transport: Transport, strategy: Strategy,
               state: LoopState, nodes: list[int]) -> list[int]:
    """Hello to every node; returns the nodes ordered by client id, so that the server's sampling
    (and thus the whole run) depends on the seed only, not on the node ids a runtime assigns."""
    hello = _hello(cfg, str(run.state_dir), transport, nodes)
    strategy.bind_nodes(hello.mapping)
    # The participants' ledgers as they stand (releases after the last checkpoint of a resumed run
    # included), so that live ε is current from the first step, not only after the final fetch.
    allowed = set(cfg.participants())
    strategy.absorb_ledgers([r for r in hello.replies if hello.mapping[r.node_id] in allowed], final=False)
    state.ledger_holders = hello.ledger_holders
    state.comm.add_control(hello.bytes_down, hello.bytes_up)
    return sorted(nodes, key=hello.mapping.__getitem__)


def _restore(run: RunDirectory, strategy: Strategy) -> LoopState:
    ck = run.load_checkpoint()
    strategy.load_state_dict(ck["strategy"])
    run.truncate_metrics(ck["step"])
    return LoopState(step=ck["step"], wall_s=ck["wall_s"], comm=CommCounter.from_state_dict(ck["comm"]),
                     notes=list(ck.get("notes", [])), step_times=list(ck.get("step_times", [])),
                     failures={int(k): v for k, v in ck.get("failures", {}).items()})


def _train(cfg: ExperimentConfig, run: RunDirectory, transport: Transport, strategy: Strategy,
           state: LoopState, nodes: list[int], stop: threading.Event) -> str:
    started = time.monotonic()
    base_wall = state.wall_s
    status = "completed"
    bar = tqdm(total=cfg.steps, initial=state.step, disable=not cfg.progress, unit="step",
               desc=f"{cfg.strategy} steps", dynamic_ncols=True)
    try:
        while state.step < cfg.steps:
            if stop.is_set():
                status = "interrupted"
                break
            available = [n for n in nodes if n not in state.exhausted and n not in state.failed]
            if not available:
                status = "stopped: no client can answer (budgets exhausted or clients failed)"
                break
            round_started = time.monotonic()
            took_step, asked = _round(cfg, transport, strategy, state, available)
            if not took_step and not asked:  # the strategy needs a client that is gone (DPGAN's curator)
                status = "stopped: no client can answer (budgets exhausted or clients failed)"
                break
            if took_step:
                state.step += 1
                state.step_times.append(time.monotonic() - round_started)
                bar.update(1)
                state.wall_s = base_wall + time.monotonic() - started
                _periodic(cfg, run, strategy, state, bar)
            _report_progress(cfg, run, state)
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        bar.close()
        state.wall_s = base_wall + time.monotonic() - started
        _checkpoint(run, strategy, state)
        _report_progress(cfg, run, state, final=True)
    return status


def _report_progress(cfg: ExperimentConfig, run: RunDirectory, state: LoopState, *, final: bool = False) -> None:
    """progress.json, at most once a second: how ``fedgan deploy`` follows a run in another process."""
    now = time.monotonic()
    if final or now - state.progress_at >= 1.0:
        state.progress_at = now
        run.write_json("progress.json", {"step": state.step, "steps": cfg.steps, "wall_s": round(state.wall_s, 3),
                                         "final": final})


def _round(cfg: ExperimentConfig, transport: Transport, strategy: Strategy, state: LoopState,
           available: list[int]) -> tuple[bool, bool]:
    """One round; (whether the generator moved, whether any client was asked)."""
    step = state.step
    selected = strategy.select_nodes(available)
    exchange = transport.exchange(strategy.configure_step(step, selected))
    outcome = strategy.aggregate_step(step, exchange.replies)
    _count_bytes(strategy, state.comm, exchange)
    if outcome.took_step:
        answered = len(selected) - len(outcome.exhausted_nodes) - len(outcome.failed_nodes)
        state.comm.count_participation(answered)
        state.last_metrics = outcome.metrics
    state.exhausted.update(outcome.exhausted_nodes)
    state.failed.update(outcome.failed_nodes)
    errors = {r.node_id: r.error for r in exchange.replies if r.error}
    for node in outcome.failed_nodes:
        reason = errors.get(node) or "malformed answer (see notes)"
        state.failures[_client_key(strategy, node)] = f"step {step}: {reason}"
    for note in outcome.notes:
        tqdm.write(f"[step {step}] {note}")
        state.notes.append(f"step {step}: {note}")
    return outcome.took_step, bool(selected)


def _client_key(strategy: Strategy, node: int) -> int:
    """Bytes are reported per client (partition) id; -1 stands for a node that never identified."""
    return strategy.node_client.get(node, -1)


def _count_bytes(strategy: Strategy, comm: CommCounter, exchange: Exchange) -> None:
    for node, (total, envelope) in exchange.bytes_down.items():
        comm.add_down(_client_key(strategy, node), total, envelope)
    for node, (total, envelope) in exchange.bytes_up.items():
        comm.add_up(_client_key(strategy, node), total, envelope)


def _periodic(cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState, bar: tqdm) -> None:
    step = state.step
    if step % cfg.log_every == 0 or step == cfg.steps:
        record = _metrics_record(strategy, state)
        run.append_metrics(record)
        eps_max = record["privacy/epsilon_max"]
        postfix = {"eps_max": "unbounded" if eps_max is None else f"{eps_max:.3g}"}
        if "train/wasserstein" in record:  # only with --client-stats: clients keep it private otherwise
            postfix["w"] = f"{record['train/wasserstein']:.3g}"
        bar.set_postfix(postfix)
    if step % cfg.sample_every == 0 or step == cfg.steps:
        run.save_samples(strategy.released_generator(), step, num_classes=num_classes_for(cfg), z_dim=cfg.z_dim)
    if step % cfg.checkpoint_every == 0:
        _checkpoint(run, strategy, state)
    if cfg.eval_every and step % cfg.eval_every == 0:
        _snapshot(run, strategy, state)


def epsilon_stats(report: dict[str, Any]) -> tuple[float | None, float | None]:
    """(max, median) per-client ε over queried clients; None when any of them is unbounded."""
    eps = [c["epsilon"] for c in report["clients"] if c["queries"] > 0] or [0.0]
    if any(e is None for e in eps):
        return None, None
    return max(eps), float(np.median(eps))


def _snapshot(run: RunDirectory, strategy: Strategy, state: LoopState) -> None:
    """Keep the released generator and the privacy spent so far, for ε-vs-quality curves."""
    report = strategy.privacy_report()
    eps_max, eps_median = epsilon_stats(report)
    run.save_snapshot(state.step, strategy.released_generator().state_dict(), {
        "epsilon_max": eps_max, "epsilon_median": eps_median,
        "epsilon_amplified": report["epsilon_amplified"]["epsilon"],
    })


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
    run.save_checkpoint({
        "step": state.step,
        "wall_s": state.wall_s,
        "strategy": strategy.state_dict(),
        # Strategy-independent copy of what is released, for `fedgan evaluate`.
        "released_generator": strategy.released_generator().state_dict(),
        "comm": state.comm.state_dict(),
        "notes": state.notes,
        "step_times": state.step_times,
        "failures": state.failures,
    })


def _fetch_ledgers(cfg: ExperimentConfig, transport: Transport, strategy: Strategy, state: LoopState) -> None:
    """Ask the participating clients whose ledger may hold a release for it: privacy.json reports,
    per client, the larger of that ledger and the server's own record.

    A client's ledger grows only when it answers a release-producing message. Asked is every
    participating client (not failed) that was sent a step message by this run, or by the run
    it resumes (the per-client byte counts survive checkpoints), or whose ledger the hello did
    not find empty: releases the server did not see in this run (the debugging task's selection
    query, answered in an earlier exchange on the same client state; answers after the last
    checkpoint of a crashed run; a reused state directory) are in that set, and so is everybody
    when the ClientApp does not report its ledger at hello. Any other client's ledger is empty,
    which is what the server's mirror already says: asking it would cost one message per client
    of the federation (3,400 for FEMNIST) for nothing. Nodes that failed are asked too, with a
    short timeout (``BEST_EFFORT_TIMEOUT_S``): a late answer was charged on the client.
    """
    allowed = set(cfg.participants())
    queried = {cid for cid, sent in state.comm.down.items() if sent > 0}
    holders = state.ledger_holders
    nodes = [n for n, cid in strategy.node_client.items()
             if cid in allowed and (holders is None or cid in holders or cid in queried)]
    replies = []
    for group, timeout_s in (([n for n in nodes if n not in state.failed], None),
                             ([n for n in nodes if n in state.failed], BEST_EFFORT_TIMEOUT_S)):
        queries = strategy.ledger_queries(group)
        if not queries:
            continue
        exchange = _exchange_in_chunks(transport, queries, timeout_s=timeout_s)
        replies += exchange.replies
        state.comm.add_control(*exchange.totals())
    state.notes.extend(strategy.absorb_ledgers(replies))


def _finish(cfg: ExperimentConfig, run: RunDirectory, strategy: Strategy, state: LoopState, status: str,
            transport_name: str) -> dict[str, Any]:
    report = strategy.privacy_report(final=True)
    for c in report["clients"]:
        c["bytes_down"] = state.comm.down.get(c["client_id"], 0)
        c["bytes_up"] = state.comm.up.get(c["client_id"], 0)
        c["status"] = "failed" if c["client_id"] in state.failures else "ok"
        c["failure"] = state.failures.get(c["client_id"], "")
    statement = report["statement"]
    amplified = report["epsilon_amplified"]
    run.write_json("privacy.json", {
        "delta": cfg.delta, "accountant": cfg.accountant, "epsilon_kind": report["epsilon_kind"],
        "accounting": report["accounting"], "statement": statement, "not_private": report["not_private"],
        "do_not_publish": DO_NOT_PUBLISH, "epsilon_amplified": amplified,
        "clients": [{k: c.get(k) for k in ("client_id", "queries", "epsilon", "epsilon_reason", "epsilon_rdp",
                                           "epsilon_prv", "ledger")} for c in report["clients"]],
    })
    if state.step > 0:
        run.save_samples(strategy.released_generator(), state.step, num_classes=num_classes_for(cfg),
                         z_dim=cfg.z_dim)
    summary = {
        "strategy": cfg.strategy,
        "status": status,
        "transport": transport_name,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "model": cfg.model,
        "steps_completed": state.step,
        "steps_planned": cfg.steps,
        "num_clients": cfg.num_clients,
        "clients_per_step": cfg.clients_per_step,
        "participants": cfg.participants(),
        "batch_size": cfg.batch_size,
        "noise_multiplier": cfg.noise_multiplier,
        "clip": cfg.clip,
        "delta": cfg.delta,
        "wire_dtype": cfg.wire_dtype,
        "wire_samples": cfg.wire_samples,
        "wire_compression": cfg.wire_compression,
        "critic_fakes": cfg.critic_fakes,
        "client_stats": cfg.client_stats,
        "accountant": cfg.accountant,
        "epsilon_kind": report["epsilon_kind"],
        "accounting": report["accounting"],
        "mechanism": report["mechanism"],
        "not_private": report["not_private"],
        "clients": [{k: v for k, v in c.items() if k != "ledger"} for c in report["clients"]],
        "epsilon_max": report["epsilon_max"],
        "epsilon_amplified": {k: v for k, v in amplified.items() if k != "ledger"},
        "comm": state.comm.summary(),
        "wall_s": round(state.wall_s, 3),
        "step_latency_s": step_latency(state.step_times),
        "failed_clients": sorted(state.failures),
        "run_dir": str(run.path),
        "notes": state.notes,
        "privacy_statement": statement,
    }
    summary.update(report.get("summary_extra", {}))  # strategy-specific figures (e.g. DPGAN's q, steps)
    run.write_json("summary.json", summary)
    return summary


def step_latency(times: list[float]) -> dict[str, Any]:
    """Median and 90th percentile wall time of a generator step (the whole round: send, client
    work, replies, server update), over the steps this run directory has taken."""
    if not times:
        return {"median": None, "p90": None, "mean": None, "steps": 0}
    t = np.asarray(times)
    return {"median": float(np.median(t)), "p90": float(np.percentile(t, 90)), "mean": float(t.mean()),
            "steps": int(t.size)}


def print_summary(summary: dict[str, Any]) -> None:
    print(format_summary_table(summary), flush=True)
