"""Fed-Avg GAN through the same loop, Flower simulation and in-process: exact counters, honest ε."""

import json

import pytest

from server.reporting import RunDirectory
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
    from common.models import build_discriminator, count_params

    d_bytes = 4 * count_params(build_discriminator("tiny"))
    assert written["comm"]["bytes_per_step"]["up"] > d_bytes
    assert written["comm"]["bytes_per_step"]["down"] > written["comm"]["bytes_per_step"]["up"]
