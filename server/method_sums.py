"""What the round loop does after a step's replies: count their bytes per client, and run the secure
sums a method's server side asks for (``SumRequest``) over the run's transport (``secure_sum.py``'s
driver), their bytes counted the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.comm import CommCounter
from common.methods.protocol import StepOutcome, SumRequest, SumResult
from common.secagg import SecAggError, cohort_graph

from .secure_sum import secure_sum
from .session import Transport
from .strategy import Strategy


class _Counted:
    """``transport`` with each exchange handed to ``count`` (the run's per-client byte counts)."""

    def __init__(self, transport: Transport, count: Callable[[Any], None]) -> None:
        self._transport, self._count = transport, count
        self.setup_totals = getattr(transport, "setup_totals", (0, 0))

    def node_ids(self, expected: int) -> list[int]:
        return self._transport.node_ids(expected)

    def exchange(self, outgoing: list, *, timeout_s: float | None = None) -> Any:
        exchange = self._transport.exchange(outgoing, **({} if timeout_s is None else {"timeout_s": timeout_s}))
        self._count(exchange)
        return exchange


MAX_SUM_ATTEMPTS = 3  # a sum and up to two re-formed ones (a node offers a deposit to at most 4)


def run_requested(
    transport: Transport,
    request: SumRequest,
    count: Callable[[Any], None],
    timeout_s: float | None = None,
    on_round: Callable[[str], None] | None = None,
) -> SumResult:
    """The sum a method's server side asked for (``SumRequest``), its bytes counted by ``count``; a
    parameter no node would accept aborts it (nothing is revealed) rather than the run. A sum that
    aborts because of named culprits is re-formed without them over the same deposits (no node is
    charged again), at most ``MAX_SUM_ATTEMPTS`` times in all. A sum rejected for an out-of-range
    input says whose inputs it held (``suspects``): the method narrows them down over sums."""
    peers = getattr(transport, "secagg_peers", None)
    nodes, culprits, dropouts = list(request.nodes), {}, {}
    result = None
    for attempt in range(1, MAX_SUM_ATTEMPTS + 1):
        degree, threshold = _graph(request, len(nodes))
        try:
            result = secure_sum(
                _Counted(transport, count),
                nodes,
                bound=request.bound,
                length=request.length,
                threshold=threshold,
                degree=degree,
                session=request.session if attempt == 1 else f"{request.session}.r{attempt}",
                deposit="" if attempt == 1 else request.session,
                timeout_s=timeout_s,
                min_inputs=request.min_inputs,
                peers=peers,
                seen=request.seen,
                on_round=on_round,
            )
        except SecAggError as err:
            why = f"the sum's parameters are refused: {err}"
            return SumResult(request.session, aborted=why, dropouts=dropouts, culprits=culprits, attempts=attempt)
        culprits.update(result.culprits)
        dropouts.update(result.dropouts)
        nodes = [n for n in nodes if n not in culprits]
        if result.revealed or not result.culprits or len(nodes) < max(request.min_inputs, 3):
            break
    survivors = result.survivors if result.revealed else []
    suspects = result.survivors if result.out_of_range else []
    return SumResult(request.session, survivors, result.sum, result.aborted, dropouts, culprits, attempt, suspects)


def _graph(request: SumRequest, size: int) -> tuple[int, int]:
    """(degree, threshold) of a sum over ``size`` of the request's nodes: its own for the first sum, the
    same construction for a re-formed, smaller one (complete stays complete)."""
    if size == len(request.nodes):
        return request.degree, request.threshold
    complete = request.degree >= len(request.nodes) - 1
    return cohort_graph(size, 0 if complete else request.degree, request.min_inputs)


def count_bytes(node_client: dict[int, int], comm: CommCounter, exchange: Any) -> None:
    """An exchange's bytes, down and up, added to ``comm`` per client (-1: a node that never
    identified), as every message of the run is counted."""
    for node, (total, envelope) in exchange.bytes_down.items():
        comm.add_down(node_client.get(node, -1), total, envelope)
    for node, (total, envelope) in exchange.bytes_up.items():
        comm.add_up(node_client.get(node, -1), total, envelope)


def run_method_sums(
    transport: Transport,
    strategy: Strategy,
    step: int,
    outcome: StepOutcome,
    count: Callable[[Any], None],
    timeout_s: float,
    status: Callable[[str], None] = lambda text: None,
) -> None:
    """The sums ``strategy`` asks for after ``step``'s replies, run in turn; what they revealed goes
    into the step's ``outcome`` (none asked: nothing happens). ``status`` is told which sum and round
    runs (the progress bar's line: a first sum of 1,000 clients is minutes, never a silent 0%)."""
    requested = strategy.secure_sums(step)
    results = []
    for i, request in enumerate(requested, start=1):  # the step's releases were deposited: only sums are revealed

        def on_round(stage: str, i: int = i, size: int = len(request.nodes)) -> None:
            status(f"secure sum {i}/{len(requested)} ({size} clients): {stage} round")

        results.append(run_requested(transport, request, count, timeout_s, on_round))
    if requested:
        strategy.absorb_sums(step, results, outcome)
