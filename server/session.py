"""A run's session with its nodes, around the round loop: the hello before, the ledger fetch after.

The hello sends every node the run's configuration and learns which client (partition) it holds,
whether its privacy policy takes part, and what its ledger already holds. The fetch, after the last
step, asks every client that may hold a release for its own ledger, which privacy.json reports
(the larger of it and the server's record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from common.io.codec import PayloadError
from common.messages import HELLO, Hello, HelloReply
from common.methods import ExperimentConfig
from protos import wire

from .strategy import Incoming, Outgoing, Strategy
from .transport import Exchange

# One exchange carries at most this many messages. Flower 1.41's in-memory Grid checks every
# pending message id on each pull (InMemoryLinkState.get_message_res, every 2 ms here), so one
# exchange of K messages costs O(K) per poll. Measured with 3,400 simulated nodes: 14 s for the
# hellos in chunks of 128, 35 s in one exchange, once Flower's feeder no longer scans every node
# on each pass (while it does, that scan dominates and both take ~35 s); chunks of 16 are slower.
BROADCAST_CHUNK = 128
# A node that failed during the run is still asked for its ledger at the end (it may have answered,
# and charged itself, after the server stopped waiting), but only this long: a dead node must not
# hold the report back by a whole reply timeout.
BEST_EFFORT_TIMEOUT_S = 30.0
# The hello is a start-up exchange: nodes may still be starting (actors, a worker importing torch,
# loading its partition), so it waits at least this long whatever --reply-timeout-s says (a small
# reply timeout, meant for the per-step replies, used to break start-up).
HELLO_TIMEOUT_S = 120.0


class NodeRefused(RuntimeError):
    """A node's own privacy policy refuses the run's configuration; the message names it and why."""


class Transport(Protocol):
    setup_totals: tuple[int, int]  # bytes (down, up) of what set the transport up (a data plane's kick-off)

    def node_ids(self, expected: int) -> list[int]: ...

    def exchange(self, outgoing: list, *, timeout_s: float | None = None) -> Exchange: ...


@dataclass
class Greeting:
    """What the run's hello taught the server about its nodes."""

    mapping: dict[int, int]  # node -> client id
    ledger_holders: frozenset[int]  # clients whose ledger may hold releases (all that did not say it is empty)
    bytes_down: int
    bytes_up: int
    replies: list[Incoming] = field(default_factory=list)  # (a client with releases sends its ledger)


def hello(cfg: ExperimentConfig, transport: Transport, nodes: list[int]) -> Greeting:
    """Send every node the run's config (never where to keep its state: the node decides); learn
    its client id and its ledger.

    A reply may carry ``ledger_queries`` (queries already in the client's ledger when the run
    starts); ``fetch_ledgers`` skips a client only on that word, so a ClientApp that does not send it
    keeps every client asked. A node whose privacy policy refuses the configuration says so here, and
    the run stops before any release (``NodeRefused``, naming each node and why). Fails too when the
    nodes do not hold exactly the partitions 0..num_clients-1.
    """
    greeting = wire.encode(Hello(config=json.dumps(cfg.to_dict())))
    timeout_s = max(cfg.reply_timeout_s, HELLO_TIMEOUT_S)
    exchange = exchange_in_chunks(transport, [Outgoing(n, HELLO, greeting) for n in nodes], timeout_s=timeout_s)
    mapping, holders, refusals = {}, set(), []
    for reply in exchange.replies:
        answer = _decode_hello(reply)
        mapping[reply.node_id] = answer.client_id
        if answer.refused:
            refusals.append(f"node {reply.node_id} (client {answer.client_id}): {answer.reason or ''}")
        if answer.ledger_queries is None or answer.ledger_queries > 0:  # not said: it may hold releases
            holders.add(answer.client_id)
    _check_greeting(cfg, refusals, mapping, len(nodes))
    return Greeting(mapping, frozenset(holders), *exchange.totals(), replies=exchange.replies)


def _decode_hello(reply: Incoming) -> HelloReply:
    if reply.content is None:
        raise RuntimeError(f"node {reply.node_id} did not answer the run's hello: {reply.error}")
    try:
        return wire.decode(HelloReply, reply.content)
    except PayloadError as err:
        raise RuntimeError(f"node {reply.node_id} answered the run's hello with a malformed reply: {err}") from err


def _check_greeting(cfg: ExperimentConfig, refusals: list[str], mapping: dict[int, int], asked: int) -> None:
    if refusals:
        more = f" (and {len(refusals) - 5} more)" if len(refusals) > 5 else ""
        raise NodeRefused(
            f"{len(refusals)} of {asked} nodes refuse this run under their own privacy "
            f"policy: {'; '.join(refusals[:5])}{more}"
        )
    if sorted(mapping.values()) != list(range(cfg.num_clients)):
        raise RuntimeError(
            f"nodes hold client ids {sorted(mapping.values())}, expected 0..{cfg.num_clients - 1}: "
            "each node needs a distinct partition-id below num_clients"
        )


def greet(
    cfg: ExperimentConfig, transport: Transport, strategy: Strategy, nodes: list[int]
) -> tuple[list[int], Greeting]:
    """The hello, with the strategy told which client each node holds and the participants' ledgers
    as they stand (releases after the last checkpoint of a resumed run included, so that live ε is
    current from the first step). Returns the nodes ordered by client id, so that the server's
    sampling depends on the seed only, not on the node ids a runtime assigns."""
    greeting = hello(cfg, transport, nodes)
    strategy.bind_nodes(greeting.mapping)
    allowed = set(cfg.participants())
    strategy.absorb_ledgers([r for r in greeting.replies if greeting.mapping[r.node_id] in allowed], final=False)
    return sorted(nodes, key=greeting.mapping.__getitem__), greeting


def exchange_in_chunks(transport: Transport, outgoing: list[Outgoing], *, timeout_s: float | None = None) -> Exchange:
    """``transport.exchange`` of ``outgoing`` in pieces of ``BROADCAST_CHUNK`` messages, merged
    (``timeout_s``: wait at most this long for each piece's replies instead of the transport's own)."""
    step = BROADCAST_CHUNK
    kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
    parts = [transport.exchange(outgoing[i : i + step], **kwargs) for i in range(0, len(outgoing), step)]
    return Exchange(
        replies=[r for p in parts for r in p.replies],
        bytes_down={n: b for p in parts for n, b in p.bytes_down.items()},
        bytes_up={n: b for p in parts for n, b in p.bytes_up.items()},
    )


def fetch_ledgers(
    cfg: ExperimentConfig,
    transport: Transport,
    strategy: Strategy,
    *,
    failed: set[int],
    queried: set[int],
    holders: frozenset[int] | None,
) -> tuple[list[str], tuple[int, int]]:
    """Ask the participating clients whose ledger may hold a release for it; returns the notes the
    strategy makes of them and the bytes (down, up) the fetch cost.

    A client's ledger grows only when it answers a release-producing message. Asked is every
    participating client that was sent a step message (``queried``: by this run, or by the run it
    resumes), or whose ledger the hello did not find empty (``holders``; None: not known): releases
    the server did not see in this run (the debugging task's selection query, answered in an earlier
    exchange on the same client state; answers after the last checkpoint of a crashed run; a reused
    state directory) are in that set. Any other client's ledger is empty, which is what the server's
    record already says: asking it would cost one message per client of the federation (3,400 for
    FEMNIST) for nothing. Nodes that ``failed`` are asked too, with a short timeout
    (``BEST_EFFORT_TIMEOUT_S``): a late answer was charged on the client.
    """
    allowed = set(cfg.participants())
    nodes = [
        n
        for n, cid in strategy.node_client.items()
        if cid in allowed and (holders is None or cid in holders or cid in queried)
    ]
    replies, down, up = [], 0, 0
    for group, timeout_s in (
        ([n for n in nodes if n not in failed], None),
        ([n for n in nodes if n in failed], BEST_EFFORT_TIMEOUT_S),
    ):
        queries = strategy.ledger_queries(group)
        if not queries:
            continue
        exchange = exchange_in_chunks(transport, queries, timeout_s=timeout_s)
        replies += exchange.replies
        d, u = exchange.totals()
        down, up = down + d, up + u
    return strategy.absorb_ledgers(replies), (down, up)
