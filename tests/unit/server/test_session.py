"""The session around the loop: the run's hello and the end-of-run ledger fetch, chunked, and asking
only who may hold a release."""

import pytest

from common.messages import HelloReply, LedgerQuery, LedgerReply
from common.methods import ExperimentConfig
from protos import wire
from server import session
from server.session import fetch_ledgers, greet, hello
from server.strategy import Incoming, Outgoing
from server.transport import Exchange

NODE = 1000  # node ids differ from client ids, as in Flower


class FakeTransport:
    """Answers hello with the node's client id (and, if told, its ledger size) and ledger queries."""

    def __init__(self, num_nodes, ledger_queries=None):
        self.ledger_queries = ledger_queries  # client id -> queries at hello; None: not reported
        self.num_nodes = num_nodes
        self.exchanges: list[list[Outgoing]] = []
        self.timeouts: list[float | None] = []

    def node_ids(self, expected):
        return [NODE + i for i in range(self.num_nodes)]

    def exchange(self, outgoing, *, timeout_s=None):
        self.exchanges.append(outgoing)
        self.timeouts.append(timeout_s)
        replies = [Incoming(o.node_id, wire.encode(self._answer(o))) for o in outgoing]
        return Exchange(replies, {o.node_id: (10, 1) for o in outgoing}, {o.node_id: (5, 1) for o in outgoing})

    def _answer(self, o):
        cid = o.node_id - NODE
        if o.message_type != "query.hello":
            return LedgerReply(ledger="{}")
        queries = None if self.ledger_queries is None else self.ledger_queries.get(cid, 0)
        return HelloReply(client_id=cid, ledger_queries=queries)

    def asked(self, message_type):
        return sorted(o.node_id - NODE for ex in self.exchanges for o in ex if o.message_type == message_type)


class FakeStrategy:
    """Just the hooks the hello and the ledger fetch use."""

    def __init__(self):
        self.node_client, self.absorbed = {}, []

    def bind_nodes(self, mapping):
        self.node_client = dict(mapping)

    def ledger_queries(self, nodes):
        return [Outgoing(n, "query.ledger", wire.encode(LedgerQuery())) for n in nodes]

    def absorb_ledgers(self, replies, *, final=True):
        if not final:  # the hello's replies
            return []
        self.absorbed += [self.node_client[r.node_id] for r in replies if wire.decode(LedgerReply, r.content)]
        return []


@pytest.fixture
def cfg(tmp_path):
    return ExperimentConfig(num_clients=7, model="tiny", out=str(tmp_path / "run"))


def _run(cfg, transport, queried=(), failed=()):
    """Hello, pretend ``queried`` clients were sent a step message, then fetch the ledgers."""
    strategy = FakeStrategy()
    _, greeting = greet(cfg, transport, strategy, transport.node_ids(cfg.num_clients))
    _, cost = fetch_ledgers(
        cfg,
        transport,
        strategy,
        failed={NODE + cid for cid in failed},
        queried=set(queried),
        holders=greeting.ledger_holders,
    )
    return strategy, (greeting.bytes_down, greeting.bytes_up), cost


def test_hello_goes_out_in_chunks_and_maps_every_node(cfg, monkeypatch):
    monkeypatch.setattr(session, "BROADCAST_CHUNK", 3)
    transport = FakeTransport(7)
    greeting = hello(cfg, transport, transport.node_ids(7))
    assert [len(ex) for ex in transport.exchanges] == [3, 3, 1]
    assert greeting.mapping == {NODE + i: i for i in range(7)} and (greeting.bytes_down, greeting.bytes_up) == (70, 35)


def test_clients_that_report_nothing_are_all_asked(cfg):
    transport = FakeTransport(7)  # today's ClientApp: the hello reply says nothing about the ledger
    strategy, _, _ = _run(cfg, transport, queried=[2])
    assert transport.asked("query.ledger") == list(range(7))
    assert sorted(strategy.absorbed) == list(range(7))


def test_only_queried_clients_and_prior_ledger_holders_are_asked(cfg):
    # Client 5 answered a release before this run (say the debugging task's selection query).
    transport = FakeTransport(7, ledger_queries={5: 1})
    strategy, hello_cost, fetch_cost = _run(cfg, transport, queried=[1, 3], failed=[3])
    assert transport.asked("query.ledger") == [1, 3, 5]  # 0, 2, 4, 6 provably hold nothing
    assert sorted(strategy.absorbed) == [1, 3, 5]
    assert hello_cost == (7 * 10, 7 * 5) and fetch_cost == (3 * 10, 3 * 5)


def test_failed_nodes_are_asked_too_but_only_briefly(cfg):
    """A node that failed may have answered (and charged itself) after the server stopped waiting:
    its ledger is asked for, with a short timeout so a dead node cannot hold up the report."""
    transport = FakeTransport(7, ledger_queries={})
    _run(cfg, transport, queried=[1, 3, 4], failed=[3, 4])
    ledger_exchanges = [
        (sorted(o.node_id - NODE for o in ex), t)
        for ex, t in zip(transport.exchanges, transport.timeouts, strict=False)
        if ex[0].message_type == "query.ledger"
    ]
    assert ledger_exchanges == [([1], None), ([3, 4], session.BEST_EFFORT_TIMEOUT_S)]


def test_non_participants_are_never_asked(cfg):
    transport = FakeTransport(7, ledger_queries={5: 1, 6: 2})
    _run(cfg.replace(client_subset="1,5"), transport, queried=[1])
    assert transport.asked("query.ledger") == [1, 5]


def test_ledger_fetch_is_chunked(cfg, monkeypatch):
    monkeypatch.setattr(session, "BROADCAST_CHUNK", 2)
    transport = FakeTransport(7)
    _run(cfg, transport)
    ledger_sizes = [len(ex) for ex in transport.exchanges if ex[0].message_type == "query.ledger"]
    assert ledger_sizes == [2, 2, 2, 1]
