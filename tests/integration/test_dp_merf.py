"""DP-MERF through the one loop, in-process and in Flower's simulation: one release per client, an ε
that recomputes from the ledgers, steps that ask nobody, resume, and hostile releases."""

import json
import threading

import numpy as np
import pytest
import torch

from client.app import app as client_app
from common.calibration import ledger_epsilon
from common.methods import prepare
from common.methods.dp_merf import server as dp_merf_server
from common.methods.dp_merf.messages import MSG_EMBED, MerfRelease
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from simulations.experiments.simulate import _run_flower, _run_inprocess
from tests.helpers import tiny_cfg

MERF = dict(strategy="dp-merf", merf_features=40, merf_batch=4, log_every=1, sample_every=100, checkpoint_every=100)


@pytest.mark.parametrize("runner", [_run_inprocess, _run_flower])
def test_each_client_releases_once_and_the_generator_trains_on(tmp_path, runner):
    cfg = prepare(tiny_cfg(tmp_path / "run", num_clients=4, steps=5, target_epsilon=20.0, **MERF))
    summary, error = runner(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["status"] == "completed" and summary["steps_completed"] == 5
    assert [c["queries"] for c in summary["clients"]] == [1, 1, 1, 1]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    sigma = cfg.merf_noise_multiplier
    for c in summary["clients"]:
        assert c["epsilon"] == pytest.approx(ledger_epsilon(sigma, 1.0, 1, cfg.delta), rel=1e-6)
        assert c["epsilon"] <= 20.0 + 1e-6
    assert "releases its labelled mean embedding once" in privacy["accounting"]
    assert summary["epsilon_amplified"]["epsilon"] is None  # nobody is sampled: nothing to amplify
    # Only the first step talks to clients: 4 requests down, 4 summaries up (40 features: 10 x 81 floats).
    assert summary["comm"]["participations"] == 4
    assert summary["comm"]["bytes_up_total"] > 4 * 10 * 81 * 4
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert all(line["train/releases"] == 4 for line in lines)


def run_inprocess(cfg, *, resume=False, app=client_app):
    run = RunDirectory.open_existing(cfg.out)[0] if resume else RunDirectory.create(cfg)
    if resume:
        run.write_json("config.json", cfg.to_dict())
    transport = InProcessTransport(app, cfg.num_clients)
    return run, run_experiment(cfg, run, transport, resume=resume, transport_name="inprocess")


def test_resume_keeps_the_target_and_asks_nobody_again(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", num_clients=3, steps=3, merf_noise_multiplier=2.0, **MERF)
    run, first = run_inprocess(cfg)
    assert first["steps_completed"] == 3
    target = torch.load(run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]["target"]
    _, resumed = run_inprocess(cfg.replace(steps=6), resume=True)
    assert resumed["steps_completed"] == 6
    assert [c["queries"] for c in resumed["clients"]] == [1, 1, 1]
    after = torch.load(run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]["target"]
    assert torch.equal(target, after)


@pytest.mark.parametrize(
    ("forge", "why"),
    [
        (lambda e: e * 1e6, "no honest client sends"),
        (lambda e: np.full_like(e, np.nan), "NaN"),
        (lambda e: e[:, :-1], "shape"),
        # An integer or bool embedding of the right shape: once crashed the run (norm of an integer
        # tensor), with no summary or privacy.json, and a resume asked the same client again.
        (lambda e: e.astype(np.int64), "dtype int64"),
        (lambda e: e.astype(np.int32), "dtype int32"),
        (lambda e: (e * 100).astype(np.uint8), "dtype uint8"),
        (lambda e: e > 0, "dtype bool"),
    ],
)
def test_a_hostile_release_is_ignored_and_still_charged(tmp_path, forge, why):
    cfg = tiny_cfg(tmp_path / "run", num_clients=3, steps=2, merf_noise_multiplier=2.0, **MERF)
    run = RunDirectory.create(cfg)
    transport = InProcessTransport(client_app, cfg.num_clients)
    exchange = transport.exchange

    def forging(outgoing, **kw):
        result = exchange(outgoing, **kw)
        for reply in result.replies:
            if reply.content is not None and outgoing and outgoing[0].message_type == MSG_EMBED:
                if reply.node_id == min(r.node_id for r in result.replies):
                    release = wire.decode(MerfRelease, reply.content)
                    release.embedding = np.ascontiguousarray(forge(release.embedding))
                    reply.content = wire.encode(release)
        return result

    transport.exchange = forging
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    assert summary["steps_completed"] == 2
    assert any(why in note for note in summary["notes"]), summary["notes"]
    assert [c["queries"] for c in summary["clients"]] == [1, 1, 1]  # the forged one was released: charged
    assert len(summary["failed_clients"]) == 1
    assert (run.path / "privacy.json").exists()


def test_the_collection_asks_in_rounds_and_a_run_stopped_between_them_asks_only_the_rest(tmp_path, monkeypatch):
    """The server held every client's summary at once (16 kB each at 200 features: 1.6 GB at
    K = 10^5, stacked twice over); it asks COLLECT_CHUNK clients a round and keeps a running sum. A
    stop between rounds checkpoints the sum and whom it asked: the resumed run asks only the rest."""
    monkeypatch.setattr(dp_merf_server, "COLLECT_CHUNK", 2)
    cfg = tiny_cfg(tmp_path / "run", num_clients=5, steps=2, merf_noise_multiplier=2.0, **MERF)
    rounds, summaries, stop = [], [], threading.Event()

    def recorded(transport):
        exchange = transport.exchange

        def recording(outgoing, **kw):
            result = exchange(outgoing, **kw)
            if outgoing and outgoing[0].message_type == MSG_EMBED:
                rounds.append(sorted(transport.contexts[o.node_id].node_config["partition-id"] for o in outgoing))
                summaries.extend(wire.decode(MerfRelease, r.content).embedding for r in result.replies)
                if len(rounds) == 1:
                    stop.set()  # the first part of the run stops after its first round
            return result

        transport.exchange = recording
        return transport

    run = RunDirectory.create(cfg)
    first = run_experiment(cfg, run, recorded(InProcessTransport(client_app, 5)), transport_name="inprocess", stop=stop)
    assert first["status"] == "interrupted" and first["steps_completed"] == 0 and rounds == [[0, 1]]
    run = RunDirectory.open_existing(cfg.out)[0]
    resumed = run_experiment(cfg, run, recorded(InProcessTransport(client_app, 5)), resume=True)
    assert resumed["status"] == "completed" and resumed["steps_completed"] == 2
    assert rounds == [[0, 1], [2, 3], [4]]  # each client asked once, two at a time
    assert [c["queries"] for c in resumed["clients"]] == [1] * 5 and resumed["comm"]["participations"] == 5
    target = torch.load(run.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]["target"]
    torch.testing.assert_close(target, torch.from_numpy(np.mean(summaries, axis=0)), rtol=1e-5, atol=1e-6)
