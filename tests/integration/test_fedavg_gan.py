"""Fed-Avg GAN through the same loop, Flower simulation and in-process: exact counters, honest ε."""

import json
import threading

import pytest
import torch

from client.app import app as client_app
from common.methods.fedavg_gan.messages import MSG_ROUND, FedAvgReply
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from simulations.experiments.simulate import _run_flower, _run_inprocess
from tests.helpers import tiny_cfg


@pytest.mark.parametrize("runner", [_run_inprocess, _run_flower])
def test_fedavg_gan_rounds_participation_and_privacy(tmp_path, runner, trust_server):
    cfg = tiny_cfg(
        tmp_path / "run",
        strategy="fedavg-gan",
        num_clients=4,
        fedavg_clients_per_round=3,
        steps=3,
        local_steps=2,
        server_g_steps=2,
    )
    summary, error = runner(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    # Poisson sampling (q = 3/4): how many took part is random; every raw delta is on the record.
    assert sum(c["queries"] for c in summary["clients"]) == summary["comm"]["participations"] > 0
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    sent = [c for c in written["clients"] if c["queries"] > 0]
    assert sent and all(c["epsilon"] is None and "raw discriminator delta" in c["epsilon_reason"] for c in sent)
    assert written["epsilon_max"] is None  # untrusted server: unbounded
    amp = written["epsilon_amplified"]
    assert amp["sample_rate"] == 0.75 and amp["steps"] == 3 and amp["epsilon"] > 0
    assert amp["sampling"] == "poisson" and written["not_private"] == []
    # Both directions carry a whole discriminator (down also G): far more than its raw float32 size.
    from common.learning.models import build_discriminator, count_params

    d_bytes = 4 * count_params(build_discriminator("tiny"))
    assert written["comm"]["bytes_per_step"]["up"] > d_bytes
    assert written["comm"]["bytes_per_step"]["down"] > written["comm"]["bytes_per_step"]["up"]


def test_a_delta_that_does_not_fit_d_fails_its_sender_and_the_rounds_go_on(tmp_path):
    """Issue 23, item 14: with m = K, client 1 answering every round with a wrong-shape delta once
    discarded every round and was asked again each time: the run stalled with 0 steps (here it would
    be stopped after 6 such rounds). Now its delta is dropped, it is marked failed and never asked
    again, and the honest deltas of each round are applied."""
    cfg = tiny_cfg(tmp_path / "run", strategy="fedavg-gan", fedavg_clients_per_round=3, steps=3)
    cfg = cfg.replace(local_steps=1, server_g_steps=1, log_every=1, sample_every=100, checkpoint_every=100)
    stop, rogue_rounds = threading.Event(), []

    def app(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == 1 and message.metadata.message_type == MSG_ROUND:
            rogue_rounds.append(1)
            if len(rogue_rounds) >= 6:
                stop.set()
            answer = wire.decode(FedAvgReply, reply.content)
            name = next(iter(answer.delta))
            answer.delta[name] = torch.zeros(3, 3)
            reply.content = wire.encode(answer)
        return reply

    transport = InProcessTransport(app, cfg.num_clients, node_config={"privacy-trust-server": True})
    summary = run_experiment(cfg, RunDirectory.create(cfg), transport, transport_name="inprocess", stop=stop)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    rogue = summary["clients"][1]
    assert rogue["status"] == "failed" and rogue["queries"] == 1 and len(rogue_rounds) == 1
    assert any("(client 1) sent a malformed delta" in n and "has shape (3, 3)" in n for n in summary["notes"])
    assert [summary["clients"][k]["queries"] for k in (0, 2)] == [3, 3]
    assert summary["epsilon_amplified"]["steps"] == 3
