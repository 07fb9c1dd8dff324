"""Adding a release channel is one module and one registration (issue 41): a toy channel from a test
folder, registered as a deployment would register it, carries DP-MERF's releases end to end
(tiny, in-process) through the unchanged method and shells: its noise on the client, its events in
every ledger, its calibration, its words in the report."""

import json

import pytest

from client.app import app as client_app
from common.channels import CHANNELS, ReleaseChannel, register_channel
from common.methods import ExperimentConfig, prepare, run_terms
from common.options import ConfigError
from common.privacy import PrivacyEvent, PrivacyLedger
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests import toy_channel
from tests.helpers import tiny_cfg


@pytest.fixture
def toy(monkeypatch):
    """The registry with the toy registered (and gone again after the test)."""
    channel = toy_channel.DoubledNoise()
    monkeypatch.setitem(CHANNELS, channel.name, channel)
    return channel


def run_merf(tmp_path, **changes):
    cfg = prepare(tiny_cfg(tmp_path / "run", strategy="dp-merf", merf_features=10, merf_batch=4, steps=2, **changes))
    run = RunDirectory.create(cfg)
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=run.state_dir)
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    return cfg, summary, json.loads((run.path / "privacy.json").read_text())


def test_a_channel_from_a_test_folder_carries_a_method_end_to_end(tmp_path, toy):
    assert isinstance(toy, ReleaseChannel)  # the written contract
    cfg, summary, privacy = run_merf(tmp_path, release_channel=toy.name, merf_noise_multiplier=1.5)
    assert summary["status"] == "completed"
    assert toy.noised_releases == cfg.num_clients  # each client's summary was noised by the channel
    expected = PrivacyLedger([PrivacyEvent(noise_multiplier=3.0)]).epsilon(delta=cfg.delta)  # 2σ, what ran
    assert [c["epsilon"] for c in privacy["clients"]] == pytest.approx([expected] * cfg.num_clients)
    assert privacy["epsilon_kind"] == toy_channel.KIND and privacy["accounting"] == toy_channel.RULE
    assert toy_channel.SENTENCE in privacy["statement"]
    _, _, local = run_merf(tmp_path / "local", merf_noise_multiplier=1.5)  # the same run through the local channel
    assert local["clients"][0]["epsilon"] > 2 * expected and toy_channel.SENTENCE not in local["statement"]


def test_the_calibration_and_the_node_policy_go_through_the_channel(tmp_path, toy):
    """--target-epsilon calibrates σ so that what the channel runs (2σ) reaches the target; a node's
    minimum noise is checked against the channel's noise, not the method's."""
    cfg, summary, privacy = run_merf(tmp_path, release_channel=toy.name, target_epsilon=4.0)
    assert max(c["epsilon"] for c in privacy["clients"]) == pytest.approx(4.0, rel=0.02)
    assert summary["status"] == "completed"
    local = prepare(tiny_cfg(strategy="dp-merf", merf_features=10, target_epsilon=4.0))
    assert cfg.merf_noise_multiplier == pytest.approx(local.merf_noise_multiplier / 2, rel=0.02)
    assert run_terms(cfg).release_noise == 2 * cfg.merf_noise_multiplier  # what min-noise-multiplier is held to


def test_gswgans_answers_go_through_the_channel_too(tmp_path, toy):
    """Each answer's B clipped rows are noised by the channel (its stacked critic phase included) and
    charged as what the channel ran: 2σ/√B per answer."""
    cfg = prepare(tiny_cfg(tmp_path / "run", strategy="gswgan", release_channel=toy.name, clients_per_step=2, steps=2))
    run = RunDirectory.create(cfg)
    transport = InProcessTransport(client_app, cfg.num_clients, node_state=run.state_dir)
    summary = run_experiment(cfg, run, transport, transport_name="inprocess")
    assert summary["status"] == "completed" and toy.noised_releases == 4  # 2 steps x 2 clients
    privacy = json.loads((run.path / "privacy.json").read_text())
    per_answer = 2 * cfg.noise_multiplier / cfg.batch_size**0.5
    asked = [client for client in privacy["clients"] if client["queries"]]
    assert sum(client["queries"] for client in asked) == 4
    for client in asked:
        expected = PrivacyLedger([PrivacyEvent(noise_multiplier=per_answer, count=client["queries"])])
        assert client["epsilon"] == pytest.approx(expected.epsilon(delta=cfg.delta))
    assert privacy["epsilon_kind"] == toy_channel.KIND


def test_a_method_that_does_not_admit_the_channel_is_refused_by_name(toy):
    """Fed-Avg GAN's clear release is a raw delta the server noises: a channel that noises on the
    client in the method's place cannot carry it, and the configuration says so before any work."""
    with pytest.raises(ConfigError, match="release_channel.*strategy fedavg-gan has no toy-doubled form"):
        ExperimentConfig(strategy="fedavg-gan", release_channel=toy.name)
    with pytest.raises(ConfigError, match="release_channel.*choose one of local, secure-sum"):
        ExperimentConfig(strategy="dp-merf", release_channel="nope")
    with pytest.raises(ConfigError, match="release_channel.*contradicts secure_aggregation"):
        ExperimentConfig(strategy="dp-merf", release_channel=toy.name, secure_aggregation=True)
    with pytest.raises(TypeError, match="ReleaseChannel contract"):
        register_channel(object())
