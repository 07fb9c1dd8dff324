"""Fed-Avg GAN through the same loop, Flower simulation and in-process: exact counters, honest ε."""

import json

import pytest

from common.config import ExperimentConfig
from server.reporting import RunDirectory
from simulations.simulate import _run_flower, _run_inprocess


@pytest.mark.parametrize("runner", [_run_inprocess, _run_flower])
def test_fedavg_gan_rounds_participation_and_privacy(tmp_path, runner):
    cfg = ExperimentConfig(strategy="fedavg-gan", num_clients=4, fedavg_clients_per_round=2, steps=3,
                           model="tiny", batch_size=8, synthetic_samples_per_writer=24, local_steps=2,
                           server_g_steps=2, progress=False, eval=False, noise_seed=1, out=str(tmp_path / "run"))
    summary, error = runner(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert sum(c["queries"] for c in summary["clients"]) == 3 * 2
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert all(c["epsilon"] is None for c in written["clients"])       # untrusted server: unbounded
    assert written["epsilon_max"] is None
    amp = written["epsilon_amplified"]
    assert amp["sample_rate"] == 0.5 and amp["steps"] == 3 and amp["epsilon"] > 0
    # Both directions carry a whole discriminator (down also G): far more than its raw float32 size.
    from common.models import build_discriminator, count_params
    d_bytes = 4 * count_params(build_discriminator("tiny"))
    assert written["comm"]["bytes_per_step"]["up"] > d_bytes
    assert written["comm"]["bytes_per_step"]["down"] > written["comm"]["bytes_per_step"]["up"]
