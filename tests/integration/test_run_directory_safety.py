"""The run directory survives careless use (issue 14, items 9 and 10): one writer at a time, and a
torn last metrics line never blocks a resume or an evaluation."""

from __future__ import annotations

import subprocess
import sys
import time

from simulations.cli import main
from tests.helpers import ROOT, tiny_flags


def _finished_run(tmp_path, steps=4):
    out = tmp_path / "run"
    assert main(["simulate", *tiny_flags(steps=steps, checkpoint_every=2, out=out), "--no-eval"]) == 0
    return out


def test_a_second_process_cannot_drive_a_run_directory_in_use(tmp_path, capsys):
    out = _finished_run(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from server.reporting import RunDirectory; RunDirectory({str(out)!r}).lock(); "
            "print('locked', flush=True); import time; time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (out / "config.json").read_bytes()
        assert main(["simulate", "--resume", str(out), "--steps", "6"]) == 2
        err = capsys.readouterr().err
        assert f"in use by another fedgan process (pid {holder.pid})" in err
        assert (out / "config.json").read_bytes() == before  # nothing was touched
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 0  # free again


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_evaluation(tmp_path):
    out = _finished_run(tmp_path)
    metrics = out / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 5, "privacy/eps')  # killed mid-write
    assert main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"]) == 0
    lines = metrics.read_text().splitlines()
    assert lines and all(line.startswith("{") and line.endswith("}") for line in lines)
    metrics.write_text(metrics.read_text() + '{"step": 7, "tr')
    assert main(["evaluate", str(out), "--no-inception", "--num-samples", "100"]) == 0


def test_repeated_refusals_are_counted_not_printed_one_per_client(tmp_path, capsys):
    """Issue 14, item 18: a --target-epsilon run printed ~290 identical "client X refuses" lines."""
    import json

    out = tmp_path / "run"
    flags = tiny_flags(num_clients=6, steps=40, noise_multiplier=1.0, client_epsilon_budget=45, out=out)
    assert main(["simulate", *flags, "--no-eval"]) == 3  # stopped: every budget spent
    printed = capsys.readouterr()
    refusals = [line for line in (printed.out + printed.err).splitlines() if "refuses" in line]
    summary = json.loads((out / "summary.json").read_text())
    assert len(refusals) <= 3, refusals
    assert any(n.startswith(tuple(f"{k} more like: " for k in range(1, 100))) for n in summary["notes"]), summary[
        "notes"
    ]


def test_a_full_disk_names_the_file_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """Issue 14, item 12: "no space left" and the path, the previous checkpoint intact."""
    import errno

    import torch

    out = _finished_run(tmp_path)
    before = (out / "checkpoint.pt").read_bytes()
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if str(f).endswith("checkpoint.pt.tmp"):
            with open(f, "wb") as fh:
                fh.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    code = main(["simulate", "--resume", str(out), "--steps", "6", "--no-eval"])
    assert code != 0
    err = capsys.readouterr().err
    assert f"no space left on device writing {out / 'checkpoint.pt'}" in err
    assert (out / "checkpoint.pt").read_bytes() == before and not (out / "checkpoint.pt.tmp").exists()
