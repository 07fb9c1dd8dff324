"""A real Flower simulation (3 SuperNodes, a handful of steps) with exact counters.

Asserts what ran, not how well: steps, queries per client, bytes equal to what the codec counts
for the messages that crossed, ε strictly increasing per queried client, zero for the others.
"""

import json

import numpy as np
import pytest

from common.methods import ExperimentConfig
from common.privacy import PrivacyEvent, PrivacyLedger
from server.reporting import RunDirectory
from simulations.experiments.simulate import _run_flower, _run_inprocess
from tests.helpers import tiny_cfg

STEPS = 6


def run_cfg(tmp_path, **changes) -> ExperimentConfig:
    # Uncompressed: byte counts then depend on the shapes only, so both runtimes match.
    base = dict(
        steps=STEPS,
        n_critic=2,
        log_every=1,
        sample_every=3,
        checkpoint_every=2,
        sampling_seed=7,
        wire_compression="none",
    )
    return tiny_cfg(tmp_path / "run", **{**base, **changes})


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower")
    cfg = run_cfg(tmp)
    run = RunDirectory.create(cfg)
    summary, error = _run_flower(cfg, run, False)
    assert error is None, error
    return cfg, run, summary


def test_counters_are_exact(flower_run):
    cfg, run, summary = flower_run
    assert summary["status"] == "completed"
    assert summary["steps_completed"] == STEPS
    queries = {c["client_id"]: c["queries"] for c in summary["clients"]}
    assert sorted(queries) == [0, 1, 2]
    assert sum(queries.values()) == STEPS * cfg.clients_per_step
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    privacy = json.loads((run.path / "privacy.json").read_text())
    for c in privacy["clients"]:
        assert PrivacyLedger.from_state_dict(c["ledger"]).queries == queries[c["client_id"]]
    assert sorted(p.name for p in (run.path / "samples").iterdir()) == ["step-000003.png", "step-000006.png"]
    assert (run.path / "checkpoint.pt").exists() and (run.path / "config.json").exists()


def test_epsilon_per_client_from_the_ledger(flower_run):
    cfg, run, summary = flower_run
    privacy = json.loads((run.path / "privacy.json").read_text())
    nm = cfg.noise_multiplier / np.sqrt(cfg.batch_size)
    for c in privacy["clients"]:
        ledger = PrivacyLedger.from_state_dict(c["ledger"])
        if c["queries"] == 0:
            assert c["epsilon"] == 0
            continue
        prefix, series = PrivacyLedger(), []
        for _ in range(c["queries"]):
            prefix.record(PrivacyEvent(noise_multiplier=nm, sample_rate=1.0))
            series.append(prefix.epsilon(delta=cfg.delta))
        assert all(b > a for a, b in zip(series, series[1:], strict=False))
        assert c["epsilon"] == pytest.approx(series[-1])
        assert c["epsilon"] == pytest.approx(ledger.epsilon(delta=cfg.delta))
    assert summary["epsilon_max"] == max(c["epsilon"] for c in summary["clients"])
    assert "σ/√B" in summary["accounting"] or "sqrt" in summary["accounting"]


def test_bytes_match_the_inprocess_run_of_the_same_seed(flower_run, tmp_path):
    """Same messages through Flower and in-process: same per-client bytes (up to node-id varints)."""
    cfg, _, summary = flower_run
    cfg2 = cfg.replace(out=str(tmp_path / "inproc"))
    inproc, error = _run_inprocess(cfg2, RunDirectory.create(cfg2), False)
    assert error is None, error
    assert [c["queries"] for c in inproc["clients"]] == [c["queries"] for c in summary["clients"]]
    for a, b in zip(inproc["clients"], summary["clients"], strict=False):
        # run, node and task ids are random 64-bit varints in Flower (9 or 10 bytes each) and fixed
        # in-process: at most a few bytes per message apart
        assert abs(a["bytes_down"] - b["bytes_down"]) <= 8 * a["queries"]
        assert abs(a["bytes_up"] - b["bytes_up"]) <= 8 * a["queries"]
    per_step = summary["comm"]["bytes_per_step"]
    B, n = cfg.batch_size, cfg.n_critic
    assert (n + 1) * B * 785 < per_step["down"] < (n + 1) * B * 785 + 6000  # uint8 samples and labels
    assert B * 784 * 2 < per_step["up"] < B * 784 * 2 + 3000  # float16 gradients


def test_a_clean_flower_simulation_prints_no_warning(tmp_path):
    """Issue 14, item 14: Flower's run_simulation deprecation notice (twice) and every actor's
    "Manually terminating ClientAppActor" are silenced; nothing else is."""
    import subprocess
    import sys

    from tests.helpers import ROOT, tiny_flags

    argv = tiny_flags(steps=2, transport="flower", out=tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-m", "simulations.cli", "simulate", *argv], cwd=ROOT, capture_output=True, text=True
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for notice in ("DEPRECATED FEATURE", "Manually terminating ClientAppActor", "Traceback"):
        assert notice not in output, output
