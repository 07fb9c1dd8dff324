"""Centralized DPGAN through the same loop: the curator's ledger, exact step counts, resume."""

import json

import pytest
import torch

from client.app import app as client_app
from common.methods.dpgan.messages import MSG_ROUND, DpganReply
from common.privacy import PrivacyEvent, PrivacyLedger
from protos import wire
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from simulations.experiments.simulate import _run_flower, _run_inprocess
from tests.helpers import tiny_cfg


def dpgan_cfg(tmp_path, name="run", **changes):
    return tiny_cfg(tmp_path / name, **{"strategy": "dpgan", "steps": 4, "dpgan_n_d": 3, **changes})


@pytest.mark.parametrize("runner", [_run_inprocess, _run_flower])
def test_dpgan_counts_and_epsilon_from_what_ran(tmp_path, runner):
    cfg = dpgan_cfg(tmp_path)
    summary, error = runner(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["steps_completed"] == 4
    dpgan = written["method"]["dpgan"]  # DPGAN's own figures, under its name
    assert dpgan["discriminator_steps"] == 4 * 3
    assert dpgan["sample_rate"] == pytest.approx(16 / (3 * 40))
    assert dpgan["noise_multiplier"] == cfg.dpgan_noise_multiplier
    (client,) = written["clients"]
    expected = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=16 / 120, count=12, sampling="poisson")])
    assert client["queries"] == 12
    assert client["epsilon"] == pytest.approx(expected.epsilon(delta=cfg.delta))
    assert client["epsilon_prv"] is not None and client["epsilon_prv"] <= client["epsilon"] + 1e-9


def test_dpgan_resume_continues_the_curators_ledger(tmp_path):
    cfg = dpgan_cfg(tmp_path, steps=2)
    run = RunDirectory.create(cfg)
    first, error = _run_inprocess(cfg, run, False)
    assert error is None, error
    more = cfg.replace(steps=4)
    run.write_json("config.json", more.to_dict())
    resumed, error = _run_inprocess(more, run, True)
    assert error is None, error
    assert resumed["method"]["dpgan"]["discriminator_steps"] == 12 and resumed["clients"][0]["queries"] == 12


def test_target_epsilon_calibrates_sigma_for_the_planned_steps(tmp_path):
    from common.methods import prepare

    cfg = prepare(dpgan_cfg(tmp_path, steps=3, dpgan_n_d=2, target_epsilon=5.0))
    summary, error = _run_inprocess(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    dpgan = written["method"]["dpgan"]
    assert dpgan["discriminator_steps"] == 6 and dpgan["target_epsilon"] == 5.0
    assert dpgan["noise_multiplier"] == cfg.dpgan_noise_multiplier != 1.0  # calibrated, recorded as used
    assert 4.5 < written["clients"][0]["epsilon"] <= 5.0  # reaches, never overshoots


def test_more_steps_than_calibrated_stop_at_the_target(tmp_path):
    """Adaptive n_D can take more discriminator steps than the calibration planned (target 10 ended
    at 11.74 before): the curator enforces the target as its budget and the run stops cleanly there.
    Modelled here by running twice the planned rounds."""
    from common.methods import prepare

    cfg = prepare(dpgan_cfg(tmp_path, steps=3, dpgan_n_d=2, target_epsilon=5.0)).replace(steps=6)
    summary, error = _run_inprocess(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["status"].startswith("stopped") and summary["steps_completed"] == 3
    assert summary["clients"][0]["epsilon"] <= 5.0
    assert any("epsilon budget 5 at" in n for n in summary["notes"])


def test_dpac_charges_the_classifiers_dp_steps_and_calibrates_for_them(tmp_path):
    """Centralized DPAC: C's init and its one DP step per round are (σ, q) events of the curator's
    ledger beside D's; the calibration plans for them, so the target still holds."""
    from common.methods import prepare

    plain = prepare(dpgan_cfg(tmp_path, "plain", steps=3, dpgan_n_d=2, target_epsilon=5.0))
    cfg = prepare(dpgan_cfg(tmp_path, steps=3, dpgan_n_d=2, target_epsilon=5.0, dpac_beta=0.5, dpac_init=2))
    assert cfg.dpgan_noise_multiplier > plain.dpgan_noise_multiplier  # 6 + 2 + 3 steps instead of 6
    summary, error = _run_inprocess(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    (client,) = written["clients"]
    assert client["queries"] == 3 * 2 + 2 + 3
    assert 4.5 < client["epsilon"] <= 5.0
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert "auxiliary classifier's DP-SGD steps" in privacy["statement"]


def test_dpac_generated_data_only_charges_the_init_alone(tmp_path):
    cfg = dpgan_cfg(tmp_path, steps=3, dpgan_n_d=2, dpac_beta=0.5, dpac_init=2, dpac_train="fake")
    summary, error = _run_inprocess(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["clients"][0]["queries"] == 3 * 2 + 2


def _nan_generator(state):
    return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}


def _wrong_shape_generator(state):
    name = next(iter(state))
    return {**state, name: torch.zeros(2, 2)}


@pytest.mark.parametrize(("forge", "cause"), [(_nan_generator, "NaN"), (_wrong_shape_generator, "of shape (2, 2)")])
def test_a_generator_that_cannot_be_g_stops_the_run_cleanly_and_is_never_released(tmp_path, forge, cause):
    """Issue 23, item 15: the curator's second round carries a broken G. A wrong-shape one crashed the
    run (no summary, no privacy.json); an all-NaN one was taken and its EMA released as completed. Now
    the curator is failed with the cause, the run stops with its reports, and the released G is the
    last good one; the round stays charged."""
    cfg = dpgan_cfg(tmp_path, steps=3, dpgan_n_d=2, log_every=1, sample_every=100, checkpoint_every=100)

    def app(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == MSG_ROUND and wire.decode(DpganReply, reply.content).step == 1:
            answer = wire.decode(DpganReply, reply.content)
            answer.generator = forge(answer.generator)
            reply.content = wire.encode(answer)
        return reply

    run = RunDirectory.create(cfg)
    summary = run_experiment(cfg, run, InProcessTransport(app, cfg.num_clients), transport_name="inprocess")
    assert summary["status"].startswith("stopped") and summary["steps_completed"] == 1
    (curator,) = summary["clients"]
    assert curator["status"] == "failed" and cause in curator["failure"] + " ".join(summary["notes"])
    assert curator["queries"] == 2 * 2  # both rounds ran on the curator: both are on the record
    assert (run.path / "privacy.json").exists() and (run.path / "summary.json").exists()
    released = run.load_checkpoint()["released_generator"]
    assert all(bool(torch.isfinite(v).all()) for v in released.values() if v.is_floating_point())
