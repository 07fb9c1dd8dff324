"""A signal mid-run stops after the current step with a checkpoint; --resume then finishes the run."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, tiny_flags


# Under Flower's runtime Ray's own C-level handler takes SIGTERM (and aborts the process; the last
# checkpoint stays intact), so the Flower arm is stopped with Ctrl-C (SIGINT), as a user would.
@pytest.mark.parametrize("transport, signum", [("inprocess", signal.SIGTERM), ("flower", signal.SIGINT)])
def test_signal_then_resume(tmp_path, transport, signum):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "simulations.cli",
        "simulate",
        *tiny_flags(synthetic_samples_per_writer=24, log_every=1, steps=100000, transport=transport, out=out),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    stopped_at = summary["steps_completed"]
    resume = [
        sys.executable,
        "-m",
        "simulations.cli",
        "simulate",
        "--resume",
        str(out),
        "--steps",
        str(stopped_at + 2),
        "--transport",
        "inprocess",
        "--no-progress",
    ]
    done = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_completed"] == stopped_at + 2
    assert sum(c["queries"] for c in summary["clients"]) == stopped_at + 2
