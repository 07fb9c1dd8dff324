"""GS-WGAN through secure sums on the project's real ClientApp: the step's m clients answer one fake
batch and deposit their answers, the server never receives a gradient, G moves by the revealed
sum, both guarantees come from ledgers, and what a secure step needs is checked up front."""

from __future__ import annotations

import json

import numpy as np
import pytest

from client.app import app as client_app
from common.methods import prepare
from common.methods.gswgan.messages import MSG_QUERY, GsAnswer, GsQuery
from common.options import ConfigError
from common.privacy import PrivacyLedger
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests.helpers import secure_plan, tiny_cfg

GS = dict(
    strategy="gswgan", model="tiny", batch_size=4, n_critic=1, log_every=1, sample_every=100, checkpoint_every=100
)


def secure_cfg(out, **changes):
    base = dict(num_clients=6, clients_per_step=3, steps=3, noise_multiplier=2.0, secure_aggregation=True, **GS)
    return prepare(tiny_cfg(out, **{**base, **changes}))


def test_a_step_sums_its_clients_answers_and_no_gradient_leaves_a_node(tmp_path) -> None:
    cfg = secure_cfg(tmp_path / "run")
    seen: list[tuple[GsQuery, GsAnswer]] = []

    def app(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == MSG_QUERY:
            query = wire.decode(GsQuery, message.content)
            seen.append((query, wire.decode(GsAnswer, reply.content, batch_size=4, step=query.step, secure=True)))
        return reply

    run = RunDirectory.create(cfg)
    transport = InProcessTransport(app, cfg.num_clients, node_state=tmp_path / "nodes")
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert len(seen) == 9 and all(a.deposited and a.grad is None for _, a in seen)
    for step in range(3):  # one fake batch and one session per step, shared by its clients
        queries = [q for q, _ in seen if q.step == step]
        assert len({q.session for q in queries}) == 1 and all(np.array_equal(q.fake, queries[0].fake) for q in queries)
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    plan = secure_plan(cfg)
    for client in (c for c in privacy["clients"] if c["queries"]):
        expected = PrivacyLedger([plan.protocol_event(client["queries"])]).epsilon(delta=cfg.delta)
        assert client["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert privacy["epsilon_amplified"]["kind"] == "per client, server deviates from the secure sum"
    assert privacy["epsilon_amplified"]["epsilon"] > max(c["epsilon"] for c in privacy["clients"])
    sums = summary["method"]["gswgan"]["secure_aggregation"]["sums"]
    assert [s["inputs"] for s in sums] == [3, 3, 3]


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"clients_per_step": 2}, "clients_per_step"), ({"secagg_threshold": 4}, "secagg_threshold")],
)
def test_what_a_secure_step_needs_is_checked_up_front(tmp_path, changes, field) -> None:
    with pytest.raises(ConfigError, match=field):
        secure_cfg(tmp_path / "run", **changes)


def test_a_method_without_a_secure_form_refuses_the_flag(tmp_path) -> None:
    with pytest.raises(ConfigError, match="secure_aggregation.*no secure-sum form"):
        tiny_cfg(tmp_path / "run", strategy="dpgan", secure_aggregation=True)


def test_the_server_asks_no_client_whose_budget_one_more_answer_would_break(tmp_path) -> None:
    """With secure sums a refusal wastes the step's other answers (charged, and the sum may fall
    below t): the server samples only clients its records keep within the run's budget, so a run
    that spends every budget ends without a refusal or an aborted sum. It draws least-used first, so
    a budget calibrated to each client's share (ceil(12·3/6) = 6 releases) lasts all 12 steps: uniform
    draws ended this run after 10 or 11 steps with budget unspent."""
    cfg = secure_cfg(tmp_path / "run", steps=12, target_epsilon=30.0)
    run = RunDirectory.create(cfg)
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=tmp_path / "nodes")
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    sums = summary["method"]["gswgan"]["secure_aggregation"]["sums"]
    assert sums and not any(s["aborted"] for s in sums) and all(s["inputs"] == 3 for s in sums)
    assert not any("refuses" in note for note in summary.get("notes", []))
    assert all(c["epsilon"] <= 30.0 + 1e-6 for c in summary["clients"])
    assert summary["status"] == "completed" and summary["steps_completed"] == 12
    assert [c["queries"] for c in summary["clients"]] == [6] * 6


def test_the_deviating_servers_figure_composes_every_run_on_a_nodes_state(tmp_path) -> None:
    """Audit 4, item 6: two runs on one node state; the headline composed both runs' releases (the
    client's ledger), the "server deviates" figure only the second run's (the server's record), and
    release.json published the smaller. Now the client keeps its own-share ledger beside its ledger
    and the report takes the larger: both figures compose the same releases."""
    from common.channels.secure_server import KIND_DEVIATING
    from common.secagg.plan import release_events

    nodes = tmp_path / "nodes"
    for name in ("first", "second"):
        cfg = secure_cfg(tmp_path / name)
        transport = InProcessTransport(client_app, cfg.num_clients, node_state=nodes)
        assert run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")["status"] == (
            "completed"
        )
    privacy = json.loads((tmp_path / "second" / "privacy.json").read_text())
    assert sum(c["queries"] for c in privacy["clients"]) == 18  # both runs' releases: 2 × 3 steps × 3 clients
    protocol, own = release_events(secure_plan(cfg))
    deviating = privacy["epsilon_amplified"]
    assert deviating["kind"] == KIND_DEVIATING
    expected = max(
        PrivacyLedger([own.times(c["queries"])]).epsilon(delta=cfg.delta) for c in privacy["clients"] if c["queries"]
    )
    assert deviating["epsilon"] == pytest.approx(expected, rel=1e-6)
    release = json.loads((tmp_path / "second" / "publish" / "release.json").read_text())
    assert release["epsilon_amplified"]["epsilon"] == pytest.approx(expected, rel=1e-6)


def test_the_progress_line_says_which_secure_sum_and_round_runs(tmp_path, capsys) -> None:
    """Issue 41: a first step with secure sums sat at 0% for 17 minutes with no word of what it did.
    The bar's status line names the sum, its cohort and the round as each starts."""
    cfg = secure_cfg(tmp_path / "run", steps=1, progress=True)
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=tmp_path / "nodes")
    run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")
    err = capsys.readouterr().err
    assert "secure sum 1/1 (3 clients): advertise round" in err, err[-2000:]
