"""A seeded run (``--init-release dp-merf``) end to end through the CLI, in-process and tiny: stage 1
(DP-MERF's one-shot release, in ``<run>/seed``) and stage 2 (GS-WGAN from it) compose in each
client's one ledger, as dp-accounting recomputes them from the configuration and the nodes' own
records; a node's policy that refuses either stage stops the run before anything is released; and a
run killed (SIGKILL) in either stage resumes to completion with every release accounted for once.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from client.state import state_path
from common.io.tensor_files import load_tensors
from common.privacy import PrivacyLedger
from common.privacy.analysis import ORDERS
from common.privacy.node_ledger import node_ledger_path, read_node_book
from simulations.cli import main
from simulations.experiments.simulate import EXIT_BAD_INPUT
from tests.helpers import ROOT, SEEDED_TINY, tiny_flags, wait_until

# Secure sums need a cohort of at least 3: a step's clients (GS-WGAN) and the seed's sums (DP-MERF).
SECURE = dict(num_clients=6, clients_per_step=3, secure_aggregation=True, secagg_cohort=3)


def seeded_flags(**changes: object) -> list[str]:
    return tiny_flags(**{**SEEDED_TINY, **changes})


def independent_epsilon(events: list[tuple[float, int]], delta: float) -> float:
    """dp-accounting's RDP ε of Gaussian mechanisms (noise multiplier, count), composed."""
    accountant = RdpAccountant(orders=list(ORDERS))
    accountant.compose(dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(s), n) for s, n in events]))
    return accountant.get_epsilon(delta)


def node_releases(state: Path, num_clients: int) -> list[dict[str, int]]:
    """Each client's releases per method, as its node recorded them in its own ledger."""
    return [dict(read_node_book(state, c).by_method) for c in range(num_clients)]


# Clear: the ledger's Gaussians are dp-accounting's own, so the two RDP figures agree closely. Secure:
# each release is a Skellam sum, which dp-accounting has no event for; at these μ it costs at most a
# little more than its Gaussian twin of the same multiplier (tests/unit/common/privacy/test_skellam.py).
@pytest.mark.parametrize("channel", ["clear", "secure"])
def test_each_clients_epsilon_composes_both_stages(tmp_path, channel):
    out, state = tmp_path / "run", tmp_path / "nodes"
    changes = SECURE if channel == "secure" else {}
    assert main(["simulate", *seeded_flags(**changes, out=out), "--node-state", str(state)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    privacy = json.loads((out / "privacy.json").read_text())
    delta = privacy["delta"]
    seed_sigma = cfg["init_noise_multiplier"]  # the seed release's, as calibrated and written
    answer_sigma = cfg["noise_multiplier"] / math.sqrt(cfg["batch_size"])  # one GS-WGAN answer: σ/√B
    assert seed_sigma > 0 and answer_sigma > 0

    released = node_releases(state, cfg["num_clients"])
    assert all(r.get("dp-merf") == 1 for r in released), released  # every client seeded, once
    # a step's clients answer (one whose budget is spent refuses, and the step goes on without it)
    assert cfg["steps"] <= sum(r.get("gswgan", 0) for r in released) <= cfg["steps"] * cfg["clients_per_step"]
    alone = []
    for c in privacy["clients"]:
        answers = released[c["client_id"]].get("gswgan", 0)
        assert c["queries"] == 1 + answers
        history = c["ledger"]["history"]
        assert [e["count"] for e in history] == [1] + ([answers] if answers else [])
        assert [e["noise_multiplier"] for e in history] == pytest.approx([seed_sigma, answer_sigma][: len(history)])
        assert all(e.get("noise", "gaussian") == ("skellam" if channel == "secure" else "gaussian") for e in history)
        expected = independent_epsilon([(seed_sigma, 1), (answer_sigma, answers)], delta)
        if channel == "clear":
            assert c["epsilon"] == pytest.approx(expected, rel=1e-6)
        else:
            assert expected * (1 - 2e-3) <= c["epsilon"] <= expected * 1.01
        alone.append(independent_epsilon([(answer_sigma, answers)], delta) if answers else 0.0)

    stages = {s["stage"]: s for s in privacy["stages"]}
    assert list(stages) == ["seed", "refinement", "total"]
    seed, refinement, total = stages["seed"], stages["refinement"], stages["total"]
    assert seed["method"] == "dp-merf" and refinement["method"] == "gswgan"
    assert seed["epsilon_max"] <= cfg["init_epsilon"] + 1e-6
    rel = 1e-6 if channel == "clear" else 1e-2
    assert seed["epsilon_max"] == pytest.approx(independent_epsilon([(seed_sigma, 1)], delta), rel=rel)
    assert refinement["epsilon_max"] == pytest.approx(max(alone), rel=rel)
    assert total["epsilon_max"] == max(c["epsilon"] for c in privacy["clients"])
    assert total["epsilon_max"] <= cfg["target_epsilon"] + 1e-9
    assert seed["releases"] == cfg["num_clients"]
    assert refinement["releases"] == sum(r.get("gswgan", 0) for r in released)
    assert total["releases"] == seed["releases"] + refinement["releases"]
    if channel == "secure":  # the figure against a deviating server composes the seed's own shares too
        beside = privacy["epsilon_amplified"]
        seed_beside = json.loads((out / "seed" / "privacy.json").read_text())["epsilon_amplified"]
        composed = PrivacyLedger.from_state_dict(beside["ledger"])
        assert composed.extends(PrivacyLedger.from_state_dict(seed_beside["ledger"]))  # the seed's shares first
        assert beside["epsilon"] > seed_beside["epsilon"]


def nothing_released(out: Path, state: Path, num_clients: int) -> None:
    """No node charged a release, and neither stage left a checkpoint or a report."""
    assert not any(node_ledger_path(state, c).exists() for c in range(num_clients))
    assert all(read_node_book(state, c).ledger.queries == 0 for c in range(num_clients))
    for path in ("seed/checkpoint.pt", "seed/summary.json", "seed_start.pt", "checkpoint.pt", "summary.json"):
        assert not (out / path).exists(), path


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        # the seed's share (2) and the total (10) both exceed it: whichever hello asks first is refused
        ("max-epsilon = 1.0", r"epsilon budget (2|10) exceeds the node's maximum 1"),
        ("min-noise-multiplier = 3.0", r"noise multiplier [0-9.]+ of each release is below the node's minimum 3"),
    ],
    ids=["max-epsilon", "min-noise-multiplier"],
)
def test_a_seed_stage_its_nodes_refuse_stops_before_any_release(tmp_path, capsys, policy, reason):
    out, state, policy_file = tmp_path / "run", tmp_path / "nodes", tmp_path / "policy.toml"
    policy_file.write_text(policy + "\n")
    flags = seeded_flags(out=out)
    code = main(["simulate", *flags, "--node-state", str(state), "--node-policy", str(policy_file)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "4 of 4 nodes refuse this run under their own privacy policy" in err
    assert len(re.findall(reason, err)) == 4, err
    cfg = json.loads((out / "config.json").read_text())
    assert 0 < cfg["init_noise_multiplier"] < 3.0  # the seed's own noise is below the minimum too
    nothing_released(out, state, 4)


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ("max-epsilon = 5.0", "epsilon budget 10 exceeds the node's maximum 5"),  # the seed's share is 2
        # the seed's σ ≈ 2.15 passes; a GS-WGAN answer's σ/√B ≈ 0.77 does not
        ("min-noise-multiplier = 1.0", "of each release is below the node's minimum 1"),
    ],
    ids=["max-epsilon", "min-noise-multiplier"],
)
def test_a_seeded_run_whose_second_stage_the_nodes_refuse_releases_nothing(tmp_path, capsys, policy, reason):
    """A policy that admits the seed stage but not stage 2. The seed stage's own hello carries only
    the seed's terms (its share of the budget, its noise): checked there alone, every node released
    its seed and then refused stage 2, ε 2 spent on a run that stops. Each node checks the whole run
    before the seed stage starts."""
    out, state, policy_file = tmp_path / "run", tmp_path / "nodes", tmp_path / "policy.toml"
    policy_file.write_text(policy + "\n")
    code = main(["simulate", *seeded_flags(out=out), "--node-state", str(state), "--node-policy", str(policy_file)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "4 of 4 nodes refuse this run under their own privacy policy" in err and err.count(reason) == 4, err
    nothing_released(out, state, 4)


def progress(run_dir: Path) -> int:
    """The step a running stage's progress.json shows (0 before its first)."""
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def charges(state: Path) -> dict[str, int]:
    """When each node's ledger counter was last written (a charge writes it)."""
    return {p.name: p.stat().st_mtime_ns for p in state.glob("node-ledger-*.count")}


# What each kill needs: a stage long enough to be caught between its first checkpoint and its end.
# Stage 2's answers after its last checkpoint are charged but lost to the generator, and its
# calibration leaves each client ceil(T·m/K) answers: 5 clients, 2 a step, 21 steps leave 45 for 42
# (one lost step fits; with T·m/K whole, a resumed run runs out of budget one step short).
KILL_IN = {
    "seed": dict(init_steps=40, merf_features=200, merf_batch=16, checkpoint_every=5, steps=3),
    "refinement": dict(num_clients=5, init_steps=2, steps=21, checkpoint_every=1),
}


@pytest.mark.parametrize("stage", list(KILL_IN))
def test_a_seeded_run_killed_in_either_stage_resumes_to_completion(tmp_path, stage):
    out, state = tmp_path / "run", tmp_path / "nodes"
    changes = KILL_IN[stage]
    flags = [*seeded_flags(**changes, out=out), "--node-state", str(state)]
    cli = [sys.executable, "-m", "simulations.cli", "simulate"]
    proc = subprocess.Popen([*cli, *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watched = out / "seed" if stage == "seed" else out
    planned = changes["init_steps"] if stage == "seed" else changes["steps"]
    try:
        # progress.json is written after each step's checkpoint (at most once a second): once it shows
        # a step past the first periodic checkpoint, the stage has released and can be resumed mid-way
        wait_until(
            lambda: progress(watched) >= changes["checkpoint_every"] or proc.poll() is not None,
            timeout_s=240,
            what=f"the {stage} stage's first periodic checkpoint",
        )
        if stage == "refinement":  # then at the next charge to a node's ledger: mid-answer, most likely
            charged = charges(state)
            wait_until(
                lambda: charges(state) != charged or proc.poll() is not None,
                timeout_s=60,
                what="an answer",
                every_s=0.001,
            )
        assert proc.poll() is None, proc.communicate()[0]  # still running: killed mid-stage
        proc.kill()  # SIGKILL: no handler runs, no final checkpoint or summary
    finally:
        if proc.poll() is None:
            proc.kill()
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -9, output
    assert not (watched / "summary.json").exists(), output  # the stage had not completed
    stopped_at = torch.load(watched / "checkpoint.pt", weights_only=True)["step"]
    assert changes["checkpoint_every"] <= stopped_at < planned
    if stage == "refinement":
        assert json.loads((out / "seed" / "summary.json").read_text())["status"] == "completed"
    else:
        assert not (out / "checkpoint.pt").exists()
    before = node_releases(state, changes.get("num_clients", SEEDED_TINY["num_clients"]))
    assert all(r.get("dp-merf") == 1 for r in before), before  # the seed was released before the kill

    resume = [*cli, "--resume", str(out), "--transport", "inprocess", "--no-progress"]
    done = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    cfg = json.loads((out / "config.json").read_text())
    seed_summary = json.loads((out / "seed" / "summary.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert seed_summary["status"] == summary["status"] == "completed"
    assert seed_summary["steps_completed"] == cfg["init_steps"] and summary["steps_completed"] == cfg["steps"]
    privacy = json.loads((out / "privacy.json").read_text())
    stages = {s["stage"]: s["epsilon_max"] for s in privacy["stages"]}
    assert [s["stage"] for s in summary["stages"]] == list(stages) == ["seed", "refinement", "total"]
    assert 0 < stages["seed"] <= cfg["init_epsilon"] + 1e-6 and 0 < stages["refinement"] <= stages["total"]
    assert stages["total"] <= cfg["target_epsilon"] + 1e-9
    # Every release is in the report once: the seed released once per node (not again on resume), and
    # the report's ledger is the client's own, releases after the last checkpoint included. A node
    # charges its ledger, then writes its client state, then replies: a kill in between leaves the
    # node's ledger one answer ahead of what left the node (an over-count, never an under-count).
    released = node_releases(state, cfg["num_clients"])
    assert all(r.get("dp-merf") == 1 for r in released), released
    for c in privacy["clients"]:
        cid, reported = c["client_id"], PrivacyLedger.from_state_dict(c["ledger"])
        kept = PrivacyLedger.from_state_dict(load_tensors(state_path(state, cid))["ledger"])
        book = read_node_book(state, cid).ledger
        assert reported == kept and c["queries"] == kept.queries, (cid, released)
        assert book.extends(kept) and book.queries - kept.queries <= 1, (cid, released)
        assert c["epsilon"] == pytest.approx(kept.epsilon(delta=privacy["delta"]), rel=1e-9)
        assert c["epsilon"] <= cfg["target_epsilon"] + 1e-9


def test_a_seeded_run_stopped_by_a_signal_in_its_seed_stage_exits_130(tmp_path):
    """SIGTERM in stage 1 is an interruption, as in any run: exit 130 with a checkpoint to resume
    (it read "seed stage: interrupted", which the CLI took for a stopped run, exit 3)."""
    out = tmp_path / "run"
    flags = seeded_flags(**{**KILL_IN["seed"], "init_steps": 100000}, out=out)
    cli = [sys.executable, "-m", "simulations.cli", "simulate"]
    proc = subprocess.Popen([*cli, *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: progress(out / "seed") >= 1 or proc.poll() is not None, timeout_s=240, what="a seed step")
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert json.loads((out / "seed" / "summary.json").read_text())["status"] == "interrupted"
    assert f"--resume {out}" in output and not (out / "checkpoint.pt").exists()


def test_the_summary_counts_the_seed_stages_wall_time(tmp_path, capsys):
    """Stage 2's loop alone would understate what the run took: summary.json adds stage 1's wall time
    and the server's critic (kept in seed_start.pt for a resume), and the table prints both."""
    out = tmp_path / "run"
    assert main(["simulate", *seeded_flags(out=out, init_critic_steps=5)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    seed_wall = json.loads((out / "seed" / "summary.json").read_text())["wall_s"]
    derive_s = load_tensors(out / "seed_start.pt")["derive_s"]
    assert seed_wall > 0 and derive_s > 0
    assert summary["prior_wall_s"] == pytest.approx(seed_wall + derive_s, abs=1e-3)
    whole = summary["wall_s"] + summary["prior_wall_s"]
    printed = capsys.readouterr().out
    assert (
        f"{whole:.1f} s with the {summary['prior_wall_s']:.1f} s before it (the seed stage and its critic)" in printed
    )
    assert not json.loads((out / "seed" / "summary.json").read_text())["prior_wall_s"]  # stage 1 had nothing before
