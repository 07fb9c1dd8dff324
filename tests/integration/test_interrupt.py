"""A signal mid-run stops after the current step with a checkpoint; --resume then finishes the run."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, tiny_flags


def start_endless_run(out: Path, transport: str) -> subprocess.Popen:
    """`fedgan simulate` of a tiny run too long to finish, writing a metrics line every step."""
    flags = tiny_flags(synthetic_samples_per_writer=24, log_every=1, steps=100000, transport=transport, out=out)
    cmd = [sys.executable, "-m", "simulations.cli", "simulate", *flags]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# Under Flower's runtime Ray's own C-level handler takes SIGTERM (and aborts the process; the last
# checkpoint stays intact), so the Flower arm is stopped with Ctrl-C (SIGINT), as a user would.
@pytest.mark.parametrize("transport, signum", [("inprocess", signal.SIGTERM), ("flower", signal.SIGINT)])
def test_signal_then_resume(tmp_path, transport, signum):
    out = tmp_path / "run"
    proc = start_endless_run(out, transport)
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


def test_a_killed_flower_simulation_leaves_nothing_running(tmp_path):
    """Issue 14, item 16: killing the CLI (SIGKILL; SIGTERM is turned into an abort by Ray) left
    Ray's dashboard and runtime-env agents and the ClientApp actor running under init, ignoring
    SIGTERM. The reaper the CLI starts ends every process the simulation started."""
    from simulations.deploy.processes import alive, descendants
    from tests.helpers import wait_until

    out = tmp_path / "run"
    proc = start_endless_run(out, "flower")
    metrics = out / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and metrics.read_text().strip(), timeout_s=240, what="the first step")
        started = descendants([proc.pid])
        names = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid, _ in started]
        assert any(b"ray::" in name for name in names), names  # Ray's agents and actor, and the reaper
    finally:
        proc.kill()
    output, _ = proc.communicate(timeout=60)
    wait_until(lambda: not any(alive(p) for p in started), timeout_s=60, what="every started process to end")
    assert "ended" in output and "process(es) the simulation left running" in output, output
