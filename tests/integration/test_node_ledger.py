"""One node, one ledger (docs/privacy.md, "One node, one ledger"): every method's releases from a node
compose in the ledger the node keeps where its own configuration says, and its budget is checked
there, across runs."""

import json

import pytest

from common.messages import HELLO, Hello, HelloReply
from common.privacy import PrivacyLedger
from common.privacy.node_ledger import NODE_STATE_ENV, node_ledger_path, read_node_book
from protos import wire
from server.session import NodeRefused, hello
from server.transport import InProcessTransport, Outgoing
from simulations.cli import main
from tests.helpers import tiny_cfg, tiny_flags

DELTA = 1e-5


@pytest.fixture
def nodes(tmp_path):
    """Two simulated nodes that keep their state in one place across runs, with a budget of ε 10
    each (each GS-WGAN answer below costs them ε 4.4 alone, 4 answers 9.99)."""
    policy = tmp_path / "policy.toml"
    policy.write_text("max-epsilon = 10.0\n")
    return tmp_path / "nodes", policy


def simulate(tmp_path, name, nodes, **changes):
    state, policy = nodes
    flags = tiny_flags(num_clients=2, clients_per_step=2, steps=3, noise_multiplier=3.0, **changes)
    code = main(
        ["simulate", *flags, "--out", str(tmp_path / name), "--node-state", str(state), "--node-policy", str(policy)]
    )
    return code, json.loads((tmp_path / name / "summary.json").read_text())


def node_epsilon(state, client):
    return read_node_book(state, client).ledger.epsilon(delta=DELTA)


def test_a_nodes_budget_spans_every_run_and_method(tmp_path, nodes):
    """Audit: without state-dir in the node config each run's directory started an empty ledger
    (three runs with max-epsilon 30 each spent 24: 72 in all), and DPGAN kept a ledger of its own
    (a node exhausted by GS-WGAN still ran 200 DP-SGD steps)."""
    state, _ = nodes
    code, first = simulate(tmp_path, "first", nodes)
    assert code == 0 and [c["queries"] for c in first["clients"]] == [3, 3]
    code, second = simulate(tmp_path, "second", nodes)
    # one more answer each, then refusals; the run's report counts the client files' whole history
    assert second["status"] != "completed" and [c["queries"] for c in second["clients"]] == [4, 4]
    for client in (0, 1):
        book = read_node_book(state, client)
        assert book.ledger.queries == 4 and book.by_method == {"gswgan": 4}
        assert 9.9 < node_epsilon(state, client) <= 10.0  # the 5th answer would have passed 10
    # A centralized DPGAN run on the same (exhausted) nodes: the curator refuses its first round.
    code, dpgan = simulate(tmp_path, "dpgan", nodes, strategy="dpgan", dpgan_batch_size=16, dpgan_n_d=1)
    assert dpgan["steps_completed"] == 0
    assert any("node's epsilon budget 10" in n and "pooled client" in n for n in dpgan["notes"])
    assert all(node_epsilon(state, c) <= 10.0 for c in (0, 1))


def test_dpgan_charges_every_pooled_client_in_its_own_unit(tmp_path):
    state = tmp_path / "nodes"
    flags = tiny_flags(num_clients=2, steps=2, strategy="dpgan", dpgan_batch_size=16, dpgan_n_d=2)
    assert main(["simulate", *flags, "--out", str(tmp_path / "run"), "--node-state", str(state)]) == 0
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    curator = PrivacyLedger.from_state_dict(privacy["clients"][0]["ledger"])  # example-level, the run's report
    sigma = curator.history[0].noise_multiplier
    for client in (0, 1):
        book = read_node_book(state, client)
        (event,) = book.ledger.history
        size = 40  # tiny_cfg's synthetic_samples_per_writer: each client's partition, pooled
        assert event.count == curator.queries and event.noise_multiplier == pytest.approx(sigma / (2 * size))
        assert event.sampling == "none" and book.by_method == {"dpgan": curator.queries}
        assert book.ledger.epsilon(delta=DELTA) > curator.epsilon(delta=DELTA)  # a whole partition costs more


def test_dp_merf_releases_once_per_node_unless_its_policy_sets_a_budget(tmp_path):
    """Audit: a DP-MERF client released again in every run when neither the server nor the node set a
    budget (1, 2, 3 releases over three runs)."""
    state = tmp_path / "nodes"
    flags = tiny_flags(num_clients=2, strategy="dp-merf", steps=2, merf_noise_multiplier=2.0)
    for name in ("one", "two", "three"):
        main(["simulate", *flags, "--out", str(tmp_path / name), "--node-state", str(state)])
    assert [read_node_book(state, c).by_method for c in (0, 1)] == [{"dp-merf": 1}] * 2
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert any("already released its DP-MERF summary" in n for n in summary["notes"])
    budget = tmp_path / "budget.toml"
    budget.write_text("max-epsilon = 100.0\n")  # the node's own budget now decides
    assert (
        main(
            [
                "simulate",
                *flags,
                "--out",
                str(tmp_path / "four"),
                "--node-state",
                str(state),
                "--node-policy",
                str(budget),
            ]
        )
        == 0
    )
    assert [read_node_book(state, c).by_method for c in (0, 1)] == [{"dp-merf": 2}] * 2


def test_a_hello_that_names_the_nodes_directory_or_a_node_without_one_is_refused(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path / "run")
    transport = InProcessTransport(__import__("client.app", fromlist=["app"]).app, 2, node_state=tmp_path / "nodes")
    content = wire.encode(Hello(config=json.dumps(cfg.to_dict()), state_dir=str(tmp_path / "elsewhere")))
    replies = transport.exchange([Outgoing(n, HELLO, content) for n in transport.node_ids(2)]).replies
    for reply in replies:
        answer = wire.decode(HelloReply, reply.content)
        assert answer.refused and "never the server's" in answer.reason
    assert not (tmp_path / "elsewhere").exists()
    monkeypatch.delenv(NODE_STATE_ENV)
    homeless = InProcessTransport(__import__("client.app", fromlist=["app"]).app, 2)
    with pytest.raises(NodeRefused, match="no state directory of its own"):
        hello(cfg, homeless, homeless.node_ids(2))


def test_an_unreadable_node_ledger_refuses_every_release(tmp_path):
    state = tmp_path / "nodes"
    state.mkdir()
    node_ledger_path(state, 1).write_text("{not json")
    flags = tiny_flags(num_clients=2, clients_per_step=2, steps=2)
    main(["simulate", *flags, "--out", str(tmp_path / "run"), "--node-state", str(state)])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["clients"][1]["queries"] == 0
    assert any("node ledger" in n and "unreadable" in n for n in summary["notes"])


@pytest.mark.parametrize("tamper", ["rolled back", "deleted", "deleted with its counter", "rewritten"])
def test_a_rolled_back_or_deleted_node_ledger_gives_no_fresh_budget(tmp_path, nodes, tamper):
    """Audit 4, item 11: a node ledger restored from an earlier copy, or deleted, handed the node a
    fresh budget (ε 41.65 and 55.62 against a limit of 40), and the node's own error message advised
    restoring a backup. Now the counter beside the ledger, its hash chain and the client state on the
    same disk all disagree with such a ledger, and the node releases nothing, saying why."""
    state, policy = nodes
    policy.write_text("max-epsilon = 40.0\n")

    def run(name: str, steps: int) -> tuple[int, dict]:
        flags = tiny_flags(num_clients=2, clients_per_step=2, steps=steps, noise_multiplier=3.0)
        out = ["--out", str(tmp_path / name), "--node-state", str(state), "--node-policy", str(policy)]
        return main(["simulate", *flags, *out]), json.loads((tmp_path / name / "summary.json").read_text())

    code, first = run("first", 1)
    assert code == 0 and [c["queries"] for c in first["clients"]] == [1, 1]
    earlier = node_ledger_path(state, 1).read_text()
    code, _ = run("second", 2)
    assert read_node_book(state, 1).ledger.queries == 3
    path, counter = node_ledger_path(state, 1), state / "node-ledger-00001.count"
    if tamper == "rolled back":
        path.write_text(earlier)
    elif tamper == "deleted":
        path.unlink()
    elif tamper == "deleted with its counter":  # the client state still holds the true count
        path.unlink()
        counter.unlink()
    else:  # the same count, another history: ten times the noise, so a tenth of the spending
        book = json.loads(path.read_text())
        history = book["ledger"]["history"]
        book["ledger"]["history"] = [dict(e, noise_multiplier=e["noise_multiplier"] * 10) for e in history]
        path.write_text(json.dumps(book))
    code, third = run("third", 2)
    assert third["clients"][1]["queries"] == 3, tamper  # nothing more was released by client 1
    notes = " ".join(third["notes"])
    assert "rolled back, replaced or deleted" in notes and "restore it from a backup" not in notes, notes
    assert third["clients"][0]["queries"] > 3  # the untouched node goes on
