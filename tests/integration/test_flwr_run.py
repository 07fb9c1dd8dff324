"""`flwr run .` on this checkout: Flower's own CLI, a local SuperLink in simulation mode.

`flwr run --stream` exits 0 even when the ServerApp fails, so the run status is read back with
`flwr ls --format json`: a completed run must say finished:completed, a bad config finished:failed.
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def flwr_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr-home")
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n[superlink.local]\naddress = ":local:"\noptions.num-supernodes = 3\n'
    )
    http_port, control_port = free_port(), free_port()
    env = dict(
        os.environ,
        FLWR_HOME=str(home),
        PATH=f"{BIN}:{os.environ['PATH']}",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        # where the local simulation's nodes keep their state and ledgers (inherited by the SuperLink)
        FEDGAN_NODE_STATE=str(home / "nodes"),
    )
    yield env
    _stop_local_superlink(str(http_port))


def _stop_local_superlink(port: str) -> None:
    """`flwr run` leaves its local SuperLink running detached; stop exactly the one we started."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"flower-superlink" in part for part in cmdline) and port.encode() in cmdline:
            os.kill(int(proc.name), signal.SIGTERM)


def flwr(env, *args, timeout=400):
    return subprocess.run(
        [str(BIN / "flwr"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_statuses(env) -> list[str]:
    out = flwr(env, "ls", "--format", "json", timeout=60)
    runs = json.loads(out.stdout[out.stdout.index("{") :])["runs"]
    return [r["status"] for r in sorted(runs, key=lambda r: r["pending-at"])]


def test_flwr_run_completes_and_writes_the_run_directory(flwr_env, tmp_path):
    out = tmp_path / "run"
    config = (
        f"num-clients=3 steps=4 model='tiny' batch-size=8 n-critic=1 "
        f"synthetic-samples-per-writer=24 progress=false out='{out}'"
    )
    result = flwr(flwr_env, "run", ".", "--stream", "--run-config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_statuses(flwr_env)[-1] == "finished:completed"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_completed"] == 4 and summary["transport"] == "flower-run"
    assert sum(c["queries"] for c in summary["clients"]) == 4


def test_flwr_run_with_a_bad_config_is_reported_as_failed(flwr_env):
    result = flwr(flwr_env, "run", ".", "--stream", "--run-config", "num-clients=3 noise-multiplier=-1.0")
    # Flower's CLI exits 0 here: the failure is only visible in the run's status.
    assert run_statuses(flwr_env)[-1] == "finished:failed", result.stdout + result.stderr
