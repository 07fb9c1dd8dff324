"""DPGAN seeded (``--strategy dpgan --init-release dp-merf``): its curator, which pools every partition,
makes the seed release itself in its first round, example-level (``common/methods/seeding/pooled.py``).
The release's sensitivity is 1 under adding or removing an example; the curator's one ledger holds it
first and DP-SGD's steps after it, as dp-accounting recomputes them; G starts from the fit to it; a
node whose policy refuses the seed stops the run before anything is released; a run killed (SIGKILL)
in either stage resumes or restarts with the seed released once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from common.data import num_classes_for
from common.methods import prepare
from common.methods.dp_merf.features import RANDOM_FOURIER, embed
from common.methods.dp_merf.generator import embedding_loss
from common.methods.dpgan.curator import new_node, run_round
from common.methods.seeding import seed_config
from common.methods.seeding.pooled import as_mean, noisy_sum, seed_event
from common.privacy import PrivacyLedger
from common.privacy.analysis import ORDERS
from common.privacy.node_ledger import read_node_book
from server.reporting import RunDirectory
from simulations.cli import main
from simulations.experiments.simulate import EXIT_BAD_INPUT, _run_flower, _run_inprocess
from tests.helpers import ROOT, TINY, tiny_cfg, tiny_flags, wait_until

SEEDED = dict(
    strategy="dpgan",
    steps=3,
    dpgan_n_d=2,
    target_epsilon=10.0,
    init_release="dp-merf",
    init_epsilon=2.0,
    init_steps=3,
    init_critic_steps=0,
    merf_features=20,
    merf_batch=4,
)


def seeded_cfg(tmp_path: Path, **changes: object):
    return prepare(tiny_cfg(tmp_path / "run", **{**SEEDED, **changes}))


def independent_epsilon(seed_sigma: float, sigma: float, q: float, steps: int, delta: float) -> float:
    """dp-accounting's RDP ε of one Gaussian (the seed) then ``steps`` Poisson-subsampled Gaussians."""
    accountant = RdpAccountant(orders=list(ORDERS))
    events = [dpa.GaussianDpEvent(seed_sigma)]
    if steps:
        events.append(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps))
    accountant.compose(dpa.ComposedDpEvent(events))
    return accountant.get_epsilon(delta)


def test_the_release_moves_by_at_most_one_when_an_example_is_added_or_removed(tmp_path):
    cfg = seeded_cfg(tmp_path).replace(init_noise_multiplier=0.0)  # the sum itself, to measure it
    node = new_node(cfg)
    images, labels, classes = node.images, node.labels, num_classes_for(cfg)
    noise = torch.Generator().manual_seed(0)
    whole = noisy_sum(cfg, seed_config(cfg), images, labels, classes, noise)
    for drop in (0, 17, len(labels) - 1):
        keep = torch.arange(len(labels)) != drop
        change = whole - noisy_sum(cfg, seed_config(cfg), images[keep], labels[keep], classes, noise)
        assert float(change.norm()) == pytest.approx(1.0, abs=1e-4)
    # divided by its own count it is DP-MERF's labelled mean embedding, the anchor's target
    fmap = RANDOM_FOURIER.build(seed_config(cfg), "cpu")
    assert torch.allclose(as_mean(cfg, whole), embed(fmap, images, labels, classes), atol=1e-5)


def test_the_first_round_records_the_seed_first_and_starts_g_from_its_fit(tmp_path):
    cfg = seeded_cfg(tmp_path, init_steps=60, init_weight=0.0)
    node, unseeded = new_node(cfg), new_node(cfg.replace(init_release="none"))
    run_round(node, cfg)
    run_round(unseeded, cfg.replace(init_release="none"))
    history = node.ledger.history
    assert history[0] == seed_event(cfg) and history[0].noise_multiplier == cfg.init_noise_multiplier
    assert [e.sample_rate < 1 for e in history] == [False, True] and history[1].count == cfg.dpgan_n_d
    assert unseeded.ledger.queries == cfg.dpgan_n_d  # no seed: DP-SGD alone
    first = seed_config(cfg)
    fmap = RANDOM_FOURIER.build(first, "cpu")

    def distance(generator: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(embedding_loss(generator, fmap, node.seed_target, first, torch.Generator().manual_seed(1)))

    assert distance(node.generator) < 0.7 * distance(unseeded.generator)  # measured 0.12 against 0.22


@pytest.mark.parametrize("runner", [_run_inprocess, _run_flower], ids=["inprocess", "flower"])
def test_the_curators_ledger_composes_its_seed_release_and_its_dp_sgd_steps(tmp_path, runner):
    cfg = seeded_cfg(tmp_path)
    summary, error = runner(cfg, RunDirectory.create(cfg), False)
    assert error is None, error
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    (client,) = privacy["clients"]
    history = client["ledger"]["history"]
    q = cfg.dpgan_batch_size / (cfg.num_clients * cfg.synthetic_samples_per_writer)
    assert [(e["noise_multiplier"], e["sample_rate"], e["count"]) for e in history] == [
        (cfg.init_noise_multiplier, 1.0, 1),
        (cfg.dpgan_noise_multiplier, pytest.approx(q), cfg.steps * cfg.dpgan_n_d),
    ]
    expected = independent_epsilon(
        cfg.init_noise_multiplier, cfg.dpgan_noise_multiplier, q, cfg.steps * cfg.dpgan_n_d, cfg.delta
    )
    assert client["epsilon"] == pytest.approx(expected, rel=1e-3)
    assert 9.0 < client["epsilon"] <= cfg.target_epsilon  # calibrated for the total, both composed
    stages = {s["stage"]: s["epsilon_max"] for s in privacy["stages"]}
    seed_alone = independent_epsilon(cfg.init_noise_multiplier, 0.0, 0.0, 0, cfg.delta)
    assert stages["seed"] == pytest.approx(seed_alone, rel=1e-3) and stages["seed"] <= cfg.init_epsilon
    assert stages["refinement"] < stages["total"] == pytest.approx(client["epsilon"])
    assert "the curator released once (dp-merf's summary, at example level)" in privacy["statement"]
    assert "over 6 noisy steps" in privacy["statement"]  # the seed release is not a DP-SGD step


def test_a_seed_release_a_nodes_budget_refuses_stops_before_anything_is_released(tmp_path, capsys):
    """The hello admits ε 10 per example; the node's budget, in its unit (each pooled client's whole
    partition), does not admit the seed release: the curator refuses its first round and names it."""
    out, state, policy = tmp_path / "run", tmp_path / "nodes", tmp_path / "policy.toml"
    policy.write_text("max-epsilon = 10.0\n")
    flags = tiny_flags(**SEEDED, out=out)
    code = main(["simulate", *flags, "--node-state", str(state), "--node-policy", str(policy)])
    summary = json.loads((out / "summary.json").read_text())
    assert code != 0 and summary["steps_completed"] == 0 and summary["status"] != "completed"
    assert any(
        "the seed release and 2 more DP-SGD steps would exceed the node's epsilon budget 10" in n
        for n in summary["notes"]
    ), summary["notes"]
    assert all(read_node_book(state, c).ledger.queries == 0 for c in range(TINY["num_clients"]))
    assert not (state / "dpgan-node.pt").exists()
    capsys.readouterr()


def test_a_node_whose_minimum_noise_the_seed_misses_refuses_the_run_at_its_hello(tmp_path, capsys):
    out, state, policy = tmp_path / "run", tmp_path / "nodes", tmp_path / "policy.toml"
    policy.write_text("min-noise-multiplier = 3.0\n")  # above σ_s ≈ 2.15 and DP-SGD's σ
    code = main(["simulate", *tiny_flags(**SEEDED, out=out), "--node-state", str(state), "--node-policy", str(policy)])
    assert code == EXIT_BAD_INPUT
    assert "below the node's minimum 3" in capsys.readouterr().err
    assert not (state / "dpgan-node.pt").exists() and not (out / "checkpoint.pt").exists()


def progress(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def run_cli(flags: list[str]) -> subprocess.Popen:
    cli = [sys.executable, "-m", "simulations.cli", "simulate", *flags]
    return subprocess.Popen(cli, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill(proc: subprocess.Popen) -> str:
    assert proc.poll() is None, proc.communicate()[0]  # still running: killed mid-stage
    proc.kill()
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -9, output
    return output


def curator_ledger(out: Path) -> PrivacyLedger:
    (client,) = json.loads((out / "privacy.json").read_text())["clients"]
    return PrivacyLedger.from_state_dict(client["ledger"])


def resume(out: Path) -> None:
    flags = ["--resume", str(out), "--transport", "inprocess", "--no-progress"]
    cli = [sys.executable, "-m", "simulations.cli", "simulate", *flags]
    done = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_seeded_dpgan_killed_in_its_seed_fit_released_nothing_and_resumes(tmp_path):
    """Killed while the curator fits G to its seed release (its first round): nothing left the
    curator, so nothing is charged and the curator kept no state; the resumed run (from the step-0
    checkpoint) makes its seed release once, in its first round."""
    out, state = tmp_path / "run", tmp_path / "nodes"
    changes = {**SEEDED, "init_steps": 1_000_000}
    proc = run_cli([*tiny_flags(**changes, out=out), "--node-state", str(state)])
    try:
        wait_until(lambda: (out / "checkpoint.pt").exists() or proc.poll() is not None, timeout_s=120, what="the run")
        time.sleep(3)  # inside the million-step fit (or before it: nothing is released either way)
        kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 0
    assert not (state / "dpgan-node.pt").exists()
    assert all(read_node_book(state, c).ledger.queries == 0 for c in range(3))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "init_steps": SEEDED["init_steps"]}))  # a fit that ends
    resume(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == SEEDED["steps"]
    first, *rest = curator_ledger(out).history
    assert first.sample_rate == 1.0 and all(e.sample_rate < 1 for e in rest)  # one seed, first
    assert sum(e.count for e in rest) == SEEDED["steps"] * SEEDED["dpgan_n_d"]


def test_a_seeded_dpgan_killed_after_its_seed_resumes_with_the_seed_released_once(tmp_path):
    out, state = tmp_path / "run", tmp_path / "nodes"
    changes = {**SEEDED, "steps": 60, "checkpoint_every": 1}
    proc = run_cli([*tiny_flags(**changes, out=out), "--node-state", str(state)])
    try:
        wait_until(lambda: progress(out) >= 2 or proc.poll() is not None, timeout_s=240, what="two rounds")
        kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "summary.json").exists()
    stopped_at = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    assert 2 <= stopped_at < changes["steps"]
    resume(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == changes["steps"]
    ledger = curator_ledger(out)
    first, *rest = ledger.history
    assert first.sample_rate == 1.0 and all(e.sample_rate < 1 for e in rest)  # one seed, first
    # the rounds that ran, one of them possibly twice (run on the curator, then lost with the server's
    # last checkpoint): counted, never missed
    steps = sum(e.count for e in rest)
    assert changes["steps"] * 2 <= steps <= (changes["steps"] + 1) * 2
    assert summary["clients"][0]["epsilon"] <= changes["target_epsilon"] + 1e-9
