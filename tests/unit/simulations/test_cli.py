"""The fedgan command: exit codes, clear errors before any work, the summary table, data info."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.cli import main
from tests.helpers import tiny_flags

TINY = tiny_flags(steps=3, synthetic_samples_per_writer=24)


def test_bad_values_fail_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--noise-multiplier", "-1", "--out", str(out)]) == 2
    assert "noise_multiplier=-1.0" in capsys.readouterr().err
    assert not out.exists()


def test_missing_data_names_the_path_and_the_fix(tmp_path, capsys):
    code = main(
        [
            "simulate",
            "--dataset",
            "mnist",
            "--partition",
            "iid",
            "--data-dir",
            str(tmp_path / "nope"),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "nope" in err and "fedgan data download mnist" in err


def test_batch_larger_than_a_partition_is_refused(tmp_path, capsys):
    assert main(["simulate", "--batch-size", "200", "--out", str(tmp_path / "run")]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_simulate_prints_the_table_and_resume_rules(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", *TINY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for needle in ("ε per client", "bytes / step / client", "wall time", str(out)):
        assert needle in printed
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "strategy",
        "steps_completed",
        "num_clients",
        "batch_size",
        "delta",
        "accounting",
        "clients",
        "epsilon_max",
        "comm",
        "wall_s",
        "epsilon_amplified",
    ):
        assert key in summary
    assert {"noise_multiplier", "clip"} <= set(summary["method"]["gswgan"])  # the method's own, under its name
    assert {"bytes_per_step", "bytes_down_total", "bytes_up_total"} <= set(summary["comm"])
    assert main(["simulate", "--out", str(out), *TINY]) == 2  # refuses to overwrite a run
    assert "already holds a run" in capsys.readouterr().err
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed" / "config.json").write_text("{}")
    assert main(["simulate", "--out", str(tmp_path / "crashed"), *TINY]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["simulate", "--resume", str(out), "--clip", "2.0"]) == 2
    assert "cannot change clip" in capsys.readouterr().err
    resumed = ["simulate", "--resume", str(out), "--steps", "5", "--no-progress", "--transport", "inprocess"]
    assert main([*resumed, "--parallel-clients", "2", "--ray-actor-cpus", "1"]) == 0  # where, not what
    assert json.loads((out / "summary.json").read_text())["steps_completed"] == 5
    resumed_cfg = json.loads((out / "config.json").read_text())
    assert resumed_cfg["parallel_clients"] == 2 and resumed_cfg["ray_actor_cpus"] == 1


def test_a_calibrated_run_says_before_training_which_steps_would_spend_the_budget_it_pays_for(tmp_path, capsys):
    """3 clients, 1 a step, 2 steps at --target-epsilon: each client's budget is one answer, 2 of 3
    are asked for; the note comes before the run's table and names the --steps that asks for all."""
    flags = tiny_flags(steps=2, target_epsilon=10, out=tmp_path / "run")
    assert main(["simulate", *flags, "--no-eval"]) == 0
    printed = capsys.readouterr().out
    note = next(line for line in printed.splitlines() if line.startswith("fedgan: note: "))
    assert "asks for 2 answers" in note and "--steps 3 " in note
    assert printed.index(note) < printed.index("wall time")


def test_data_info_reports_partitions(capsys):
    assert main(["data", "info", "--num-clients", "4", "--synthetic-samples-per-writer", "40"]) == 0
    printed = capsys.readouterr().out
    assert "synthetic" in printed and "40" in printed


def test_console_script_help_explains_every_flag():
    exe = Path(sys.executable).parent / "fedgan"
    if not exe.exists():
        pytest.skip("console script not installed (run `make test`, which installs the package)")
    out = subprocess.run([str(exe), "simulate", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert "--client-epsilon-budget" in out.stdout and "--wire-dtype" in out.stdout


def test_node_policy_flag_reaches_the_simulated_nodes(tmp_path, capsys, monkeypatch):
    """`--node-policy` is what every simulated node pins: a run asking for less noise is refused
    (exit 2, naming the nodes and why), and a malformed policy file is bad input before any work."""
    from common.privacy.policy import POLICY_ENV

    monkeypatch.setenv(POLICY_ENV, "")  # restored after the test: main() points it at the policy file
    policy = tmp_path / "policy.toml"
    policy.write_text("min-noise-multiplier = 0.5\n")  # each answer's own multiplier σ/√B: 1.07/√8 = 0.378
    args = [
        "simulate",
        *tiny_flags(num_clients=2, steps=1, synthetic_samples_per_writer=24),
        "--node-policy",
        str(policy),
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "2 of 2 nodes refuse" in err and "minimum 0.5" in err
    assert main([*args, "--noise-multiplier", "2.5", "--out", str(tmp_path / "b")]) == 0
    policy.write_text("min-noise-multiplier = 'lots'\n")
    assert main([*args, "--out", str(tmp_path / "c")]) == 2
    assert "min-noise-multiplier must be a number" in capsys.readouterr().err


def test_input_the_review_found_failing_late_is_exit_2_with_one_line(tmp_path, capsys):
    """Issue 14, item 12: each case exits 2 with a message naming the cause, and writes nothing."""
    from simulations.cli import main as cli_main
    from tests.helpers import tiny_flags

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "config.json").write_text("[1, 2]")
    cases = [
        (["simulate", *tiny_flags(out=a_file)], "is a file, not a directory"),
        (["simulate", "--resume", str(listed)], "holds a list"),
        (["simulate", *tiny_flags(seed=-1, out=tmp_path / "s1")], "invalid seed=-1"),
        (["simulate", *tiny_flags(seed=10**24, out=tmp_path / "s2")], "must be below 2**31"),
        (["evaluate", str(listed), "--fid-samples", "1"], "invalid --fid-samples=1"),
        (["evaluate", str(listed), "--inception-weights", str(tmp_path / "none.pth")], "does not exist"),
    ]
    for argv, words in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "s1").exists() and not (tmp_path / "s2").exists()


def test_progress_bars_write_a_few_lines_when_not_on_a_terminal(tmp_path, capsys):
    """Issue 14, item 15: into a log (stderr not a terminal), not a line per step."""
    assert main(["simulate", *tiny_flags(steps=40, progress=True, out=tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    bar_lines = [chunk for chunk in err.replace("\r", "\n").splitlines() if "gswgan steps" in chunk]
    assert 1 <= len(bar_lines) <= 8, bar_lines  # 40 steps: a line per step before


def test_broken_run_directories_are_exit_2_for_resume_and_evaluate(tmp_path, capsys):
    """Issue 14, item 12: a checkpoint missing keys, a summary.json of {}, a corrupt snapshot."""
    import shutil

    import torch

    run = tmp_path / "run"
    assert main(["simulate", *tiny_flags(steps=3, out=run), "--eval-every", "2", "--no-eval"]) == 0
    broken = tmp_path / "ck"
    shutil.copytree(run, broken)
    torch.save({"step": 3}, broken / "checkpoint.pt")
    assert main(["simulate", "--resume", str(broken), "--steps", "5"]) == 2
    assert "lacks strategy" in capsys.readouterr().err
    empty = tmp_path / "empty"
    shutil.copytree(run, empty)
    (empty / "summary.json").write_text("{}")
    assert main(["evaluate", str(empty), "--no-inception", "--num-samples", "50"]) == 2
    assert "is incomplete" in capsys.readouterr().err
    snap = tmp_path / "snap"
    shutil.copytree(run, snap)
    snapshots = sorted((snap / "snapshots").glob("step-*.pt"))
    assert snapshots
    snapshots[0].write_bytes(b"garbage")
    assert main(["evaluate", str(snap), "--no-inception", "--num-samples", "50"]) == 2
    assert "is corrupt" in capsys.readouterr().err


def test_a_missing_test_split_stops_before_training(tmp_path, capsys):
    """Issue 14, item 12: the evaluation's test split is checked up front, not after the run."""
    import numpy as np

    from common.data.testing import write_mnist_like

    rng = np.random.default_rng(0)
    write_mnist_like(tmp_path / "mnist", rng.integers(0, 255, (64, 28, 28), dtype=np.uint8), np.arange(64) % 10)
    argv = ["simulate", *tiny_flags(dataset="mnist", partition="iid", num_clients=2, eval=True, out=tmp_path / "run")]
    assert main([*argv, "--data-dir", str(tmp_path / "mnist")]) == 2
    err = capsys.readouterr().err
    assert "t10k" in err or "test" in err
    assert not (tmp_path / "run").exists()
