"""The round loop through the in-process transport: resume, budgets, faulty clients, bad input."""

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Array

from client.app import app as client_app
from common.config import ExperimentConfig
from server.loop import run_experiment
from server.reporting import RunDirectory, RunDirectoryError
from server.transport import InProcessTransport


def cfg_for(tmp_path, name="run", **changes) -> ExperimentConfig:
    base = dict(num_clients=3, steps=6, model="tiny", batch_size=8, n_critic=2,
                synthetic_samples_per_writer=24, log_every=1, sample_every=100, checkpoint_every=100,
                progress=False, eval=False, noise_seed=3, out=str(tmp_path / name))
    base.update(changes)
    return ExperimentConfig(**base)


def run_inprocess(cfg, *, resume=False, app=client_app):
    run = RunDirectory.open_existing(cfg.out)[0] if resume else RunDirectory.create(cfg)
    if resume:
        run.write_json("config.json", cfg.to_dict())
    return run, run_experiment(cfg, run, InProcessTransport(app, cfg.num_clients), resume=resume,
                               transport_name="inprocess")


def test_resume_continues_exactly(tmp_path):
    straight_cfg = cfg_for(tmp_path, "straight")
    straight_run, straight = run_inprocess(straight_cfg)
    part_cfg = cfg_for(tmp_path, "parts", steps=3)
    part_run, first = run_inprocess(part_cfg)
    assert first["steps_completed"] == 3
    _, resumed = run_inprocess(part_cfg.replace(steps=6), resume=True)
    assert resumed["steps_completed"] == 6
    assert [c["queries"] for c in resumed["clients"]] == [c["queries"] for c in straight["clients"]]
    assert resumed["comm"]["bytes_up_total"] == straight["comm"]["bytes_up_total"]
    a = torch.load(straight_run.path / "checkpoint.pt", weights_only=False)["strategy"]["generator"]
    b = torch.load(part_run.path / "checkpoint.pt", weights_only=False)["strategy"]["generator"]
    for key in a["ema"]["module"]:
        assert torch.equal(a["ema"]["module"][key], b["ema"]["module"][key]), key
    steps = [json.loads(l)["step"] for l in (part_run.path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


def test_budget_refusals_stop_the_run_cleanly(tmp_path):
    cfg = cfg_for(tmp_path, steps=50, client_epsilon_budget=30.0, noise_multiplier=2.0)
    run, summary = run_inprocess(cfg)
    assert summary["status"].startswith("stopped")
    assert 0 < summary["steps_completed"] < 50
    for c in summary["clients"]:
        assert c["epsilon"] <= 30.0
    assert any("refuses" in note for note in summary["notes"])
    assert (run.path / "checkpoint.pt").exists()


def _corrupting(node_offset: int, kind: str):
    def app(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == node_offset and message.metadata.message_type == "train.gswgan":
            grad = np.zeros((8, 1, 28, 28), np.float32)
            bad = {"nan": np.full_like(grad, np.nan), "shape": grad[:-1]}[kind]
            reply.content["arrays"] = ArrayRecord({"grad": Array(bad)})
            reply.content.config_records["scalars"]["grad_encoding"] = "float32"
        return reply
    return app


@pytest.mark.parametrize("kind", ["nan", "shape"])
def test_malformed_answers_are_dropped_and_the_run_goes_on(tmp_path, kind):
    cfg = cfg_for(tmp_path, steps=8)
    _, summary = run_inprocess(cfg, app=_corrupting(1, kind))
    assert summary["status"] == "completed" and summary["steps_completed"] == 8
    assert any("malformed" in note for note in summary["notes"])
    for p in summary["clients"][0:1]:
        assert p["queries"] >= 0


def test_resume_of_a_missing_or_corrupt_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunDirectoryError, match="does not exist"):
        RunDirectory.open_existing(tmp_path / "nope")
    cfg = cfg_for(tmp_path)
    run = RunDirectory.create(cfg)
    with pytest.raises(RunDirectoryError, match="nothing to resume"):
        run.load_checkpoint()
    (run.path / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(RunDirectoryError, match="corrupt"):
        run.load_checkpoint()
    (run.path / "config.json").write_text("{")
    with pytest.raises(RunDirectoryError, match="corrupt"):
        RunDirectory.open_existing(run.path)


def test_lean_wire_sends_uint8_samples_and_float16_gradients(tmp_path):
    float32 = dict(wire_samples="float32", wire_dtype="float32", wire_compression="none")
    _, f32 = run_inprocess(cfg_for(tmp_path, "f32", steps=3, **float32))
    _, lean = run_inprocess(cfg_for(tmp_path, "lean", steps=3, wire_compression="none"))
    B, n = 8, 2
    up32, up16 = f32["comm"]["bytes_per_step"]["up"], lean["comm"]["bytes_per_step"]["up"]
    down32, down8 = f32["comm"]["bytes_per_step"]["down"], lean["comm"]["bytes_per_step"]["down"]
    assert up32 - up16 == pytest.approx(B * 784 * 2, abs=64)
    assert down32 - down8 == pytest.approx((n + 1) * B * 784 * 3, abs=64)
    assert lean["wire_dtype"] == "float16"
    assert [c["epsilon"] for c in lean["clients"]] == [c["epsilon"] for c in f32["clients"]]


def test_without_noise_the_generator_moves_toward_the_data(tmp_path):
    """Catches a wrong sign or scale anywhere between the client's gradient and G's update."""
    from common.data import load_client_partition
    from common.models import build_generator, sample_latent

    cfg = cfg_for(tmp_path, steps=40, num_clients=1, noise_multiplier=0.0, clip=1000.0, lr_g=2e-3,
                  lr_d=2e-3, ema_decay=0.0, synthetic_samples_per_writer=64)
    run, summary = run_inprocess(cfg)
    written = json.loads((run.path / "summary.json").read_text())
    assert written["epsilon_max"] is None  # σ = 0: unbounded, written as null, never as a number
    torch.manual_seed(cfg.seed)
    g = build_generator("tiny")
    g.load_state_dict(torch.load(run.path / "checkpoint.pt", weights_only=False)["strategy"]["generator"]["model"])
    z, y = sample_latent(256, 10, generator=torch.Generator().manual_seed(0)), torch.arange(256) % 10
    initial = build_generator("tiny")
    real_mean = load_client_partition(cfg, 0).images.mean().item()
    with torch.no_grad():
        before = abs(initial(z, y).mean().item() - real_mean)
        after = abs(g(z, y).mean().item() - real_mean)
    assert after < 0.5 * before
