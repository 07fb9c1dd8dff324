"""What the round loop does after a step's replies: count their bytes per client, and run the secure
sums a method's server side asks for (``SumRequest``) over the run's transport (``secure_sum.py``'s
driver), their bytes counted the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.comm import CommCounter
from common.methods.protocol import StepOutcome, SumRequest, SumResult
from common.secagg import SecAggError

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


def run_requested(
    transport: Transport, request: SumRequest, count: Callable[[Any], None], timeout_s: float | None = None
) -> SumResult:
    """The sum a method's server side asked for (``SumRequest``), its bytes counted by ``count``; a
    parameter no node would accept aborts it (nothing is revealed) rather than the run."""
    try:
        result = secure_sum(
            _Counted(transport, count),
            request.nodes,
            bound=request.bound,
            length=request.length,
            threshold=request.threshold,
            degree=request.degree,
            session=request.session,
            timeout_s=timeout_s,
            min_inputs=request.min_inputs,
        )
    except SecAggError as err:
        return SumResult(request.session, aborted=f"the sum's parameters are refused: {err}")
    survivors = result.survivors if result.revealed else []
    return SumResult(request.session, survivors, result.sum, result.aborted, dict(result.dropouts))


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
) -> None:
    """The sums ``strategy`` asks for after ``step``'s replies, run in turn; what they revealed goes
    into the step's ``outcome`` (none asked: nothing happens)."""
    requested = strategy.secure_sums(step)
    if requested:  # the step's releases were deposited on the nodes: only their sums are revealed
        strategy.absorb_sums(step, [run_requested(transport, r, count, timeout_s) for r in requested], outcome)
