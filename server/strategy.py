"""The one strategy: the wire around a method's server side. The round loop (``loop.py``) calls these
hooks, nothing else.

A method's server side (``common/methods/<name>/server.py``, the contract's ``ServerSide``) decides
whom to ask, what to send and what the replies do, in payload dataclasses; this shell encodes what
it sends (``protos/wire.py``), decodes and validates every reply against what the step expects,
turning a lost or malformed one into a ``Reply`` that says so, and reads the ledgers the nodes send.
Transport, byte counting, logging, checkpoints and reports are the loop's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flwr.app import RecordDict
from torch import nn

from common.config import RunOptions
from common.io.codec import PayloadError
from common.messages import LEDGER, CarriedLedger, LedgerQuery
from common.methods import Method, method
from common.methods.protocol import PriorReleases, Reply, ServerSide, StepOutcome, SumRequest, SumResult
from common.privacy.records import LedgerClaim, unreadable
from protos import wire

__all__ = ["Incoming", "Outgoing", "PriorReleases", "StepOutcome", "Strategy", "build_strategy"]


@dataclass
class Outgoing:
    node_id: int
    message_type: str
    content: RecordDict


@dataclass
class Incoming:
    """A reply (or its absence): ``content`` is None when the node failed or timed out."""

    node_id: int
    content: RecordDict | None
    error: str = ""


class Strategy:
    """A method's server side (``side``), driven through the wire."""

    def __init__(self, run_method: Method, side: ServerSide) -> None:
        self.method = run_method
        self.side = side
        self._types = {request: message_type for message_type, (request, _) in run_method.messages.items()}
        self._sent: dict[int, str] = {}  # node -> the message type it was sent this step

    @property
    def node_client(self) -> dict[int, int]:
        return self.side.node_client

    def bind_nodes(self, node_client: dict[int, int]) -> None:
        """Learn which client (partition) each node holds, from the run's hello exchange."""
        self.side.bind_nodes(node_client)

    # --- a step ----------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """The nodes to query this step, of ``available`` (server randomness only)."""
        return self.side.select_nodes(available)

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        """One encoded message per selected node."""
        self._sent = {}
        out = []
        for node, payload in self.side.requests(step, nodes):
            message_type = self._types[type(payload)]
            self._sent[node] = message_type
            out.append(Outgoing(node, message_type, wire.encode(payload)))
        return out

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        """The replies decoded and validated against what the step expects, for the method."""
        expect = self.side.expectations(step)
        return self.side.aggregate(step, [self._decoded(reply, expect) for reply in replies])

    def _decoded(self, reply: Incoming, expect: dict[str, Any]) -> Reply:
        node = reply.node_id
        client = self.side.node_client.get(node, -1)
        if reply.content is None:
            return Reply(node, client, problem=reply.error, lost=True)
        reply_cls = self.method.messages[self._sent[node]][1]
        try:
            return Reply(node, client, wire.decode(reply_cls, reply.content, **expect))
        except PayloadError as err:
            return Reply(node, client, problem=str(err))

    def secure_sums(self, step: int) -> list[SumRequest]:
        """The secure sums the method asks for after this step's replies (usually none)."""
        return self.side.secure_sums(step)

    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None:
        self.side.absorb_sums(step, results, outcome)

    def released_generator(self) -> nn.Module:
        """The model that is released (and evaluated): the generator's EMA copy."""
        return self.side.released_generator()

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        """Per-client and global privacy figures for metrics, summary.json and privacy.json."""
        return self.side.privacy_report(final=final)

    # --- the clients' own ledgers --------------------------------------------------------------
    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        """Messages asking the nodes that may hold a release for their own ledgers."""
        return [Outgoing(n, LEDGER, wire.encode(LedgerQuery())) for n in self.side.ledger_nodes(nodes)]

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        """Take the ledgers the nodes sent (at the hello: ``final`` False; at the end of the run);
        returns notes for the run."""
        return self.side.absorb_ledgers([ledger_claim(reply) for reply in replies], final=final)

    # --- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.side.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.side.load_state_dict(state)


def ledger_claim(reply: Incoming) -> LedgerClaim:
    """The ledger a reply carries, as the node's claim: its text, or why it cannot be read. Any reply
    that does not decode is unreadable, never fatal."""
    if reply.content is None:
        return LedgerClaim(reply.node_id)
    try:
        carried = wire.decode(CarriedLedger, reply.content)
        return LedgerClaim(reply.node_id, carried.ledger, own_text=carried.own_ledger)
    except PayloadError as err:
        return LedgerClaim(reply.node_id, problem=unreadable(err))


def build_strategy(cfg: RunOptions, num_classes: int, prior: PriorReleases | None = None) -> Strategy:
    """The strategy of ``cfg.strategy``; ``prior`` releases only for a method that accepts them (a
    seed stage's, ``prior.start`` set, for a method that ``accepts_seed``)."""
    run_method = method(cfg.strategy)
    if prior is not None:
        seeded = prior.start is not None
        if not (run_method.accepts_seed if seeded else run_method.accepts_prior_releases):
            what = "start from a seed release" if seeded else "account for releases made before its run"
            raise ValueError(f"{cfg.strategy} cannot {what}")
    return Strategy(run_method, run_method.server(cfg, num_classes, prior))
