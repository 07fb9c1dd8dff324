"""Fed-Avg GAN through secure sums on the project's real ClientApp: a round's m clients deposit their
clipped deltas with noise shares and the server sees only their sum, so a node that does not trust
the server takes part (its delta is bounded against it), and both guarantees come from ledgers."""

from __future__ import annotations

import json

import pytest

from client.app import app as client_app
from common.methods import prepare
from common.methods.fedavg_gan import release
from common.methods.fedavg_gan.messages import MSG_ROUND, FedAvgReply
from common.options import ConfigError
from common.privacy import PrivacyLedger
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests.helpers import secure_plan, tiny_cfg

FA = dict(strategy="fedavg-gan", fedavg_clients_per_round=3, local_steps=2, server_g_steps=1, log_every=1)


def secure_cfg(out, **changes):
    base = dict(num_clients=6, steps=3, fedavg_noise_multiplier=1.0, secure_aggregation=True, **FA)
    return prepare(tiny_cfg(out, **{**base, **changes}))


def test_a_round_sums_its_deltas_and_no_delta_leaves_a_node(tmp_path) -> None:
    cfg = secure_cfg(tmp_path / "run")
    replies: list[FedAvgReply] = []

    def app(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == MSG_ROUND:
            replies.append(wire.decode(FedAvgReply, reply.content))
        return reply

    run = RunDirectory.create(cfg)
    # the default node policy (no trust in the server): raw deltas would be refused, deposits are not
    transport = InProcessTransport(app, cfg.num_clients, node_state=tmp_path / "nodes")
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert len(replies) == 9 and all(r.deposited and r.delta is None for r in replies)
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    plan = secure_plan(cfg)
    for client in (c for c in privacy["clients"] if c["queries"]):
        expected = PrivacyLedger([plan.protocol_event(client["queries"])]).epsilon(delta=cfg.delta)
        assert client["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert privacy["epsilon_kind"] == "per client, server runs the secure sum, no colluding client"
    assert privacy["epsilon_amplified"]["kind"] == "per client, server deviates from the secure sum"
    sums = summary["method"]["fedavg-gan"]["secure_aggregation"]["sums"]
    assert [s["inputs"] for s in sums] == [3, 3, 3]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fedavg_clients_per_round": 2}, "fedavg_clients_per_round"),
        ({"secagg_threshold": 4}, "secagg_threshold"),
        ({"fedavg_noise_multiplier": 0.0}, "fedavg_noise_multiplier"),
    ],
)
def test_what_a_secure_round_needs_is_checked_up_front(tmp_path, changes, field) -> None:
    with pytest.raises(ConfigError, match=field):
        secure_cfg(tmp_path / "run", **changes)


def test_a_target_epsilon_run_lasts_every_round_and_spends_each_clients_share(tmp_path) -> None:
    """--target-epsilon calibrates z for each client's share ceil(T·m/K) of the rounds and makes it
    the budget; the server draws least-used first, so all T rounds run and every client spends its
    share (uniform draws stopped such runs a round or two early with budget unspent)."""
    cfg = secure_cfg(tmp_path / "run", steps=8, target_epsilon=20.0)
    assert cfg.fedavg_noise_multiplier > 0 and cfg.client_epsilon_budget == 20.0
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=tmp_path / "nodes")
    summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")
    assert summary["status"] == "completed" and summary["steps_completed"] == 8
    assert [c["queries"] for c in summary["clients"]] == [4] * 6
    assert all(c["epsilon"] <= 20.0 + 1e-6 for c in summary["clients"])


def test_a_non_finite_delta_is_zeroed_on_the_node_and_the_round_goes_on(tmp_path, monkeypatch) -> None:
    """Audit 4, item 7: a diverged local step (NaN and inf in the delta) made the client fail; the
    documentation says it is zeroed on the client. Now every coordinate that is not finite is zeroed before
    clipping and rounding, the client deposits, and the sums reveal finite deltas."""
    import torch

    real = release.flatten

    def diverged(delta, cfg):
        vector = real(delta, cfg)
        vector[::7] = float("nan")
        vector[1::7] = float("inf")
        return vector

    monkeypatch.setattr(release, "flatten", diverged)
    cfg = secure_cfg(tmp_path / "run")
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=tmp_path / "nodes")
    summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert not any(c["status"] == "failed" for c in summary["clients"])
    sums = summary["method"]["fedavg-gan"]["secure_aggregation"]["sums"]
    assert [s["inputs"] for s in sums] == [3, 3, 3] and not any(s["aborted"] for s in sums)
    state = RunDirectory.open_existing(cfg.out)[0].load_checkpoint()["strategy"]
    weights = [v for v in state["discriminator"].values() if torch.is_tensor(v)]
    assert weights and all(bool(torch.isfinite(w).all()) for w in weights)
