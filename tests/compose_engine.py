"""The compose test's Docker engine and images, prepared in the background while other tests run.

Building the images on a clean machine takes ~2 minutes, mostly waiting on the network, dpkg and
layer unpacking rather than the CPU, so ``tests/conftest.py`` starts it as soon as the compose test
is collected; the test then waits for it (and fails with the build's output if it failed). Where
no engine can start (not root, no dockerd, or dockerd does not come up: its log is quoted), the
reason is kept and the test is skipped with it.

`make test` runs the suite on two pytest-xdist workers. The engine belongs to the process that
lives for the whole session (xdist's controller, or pytest itself without xdist): it starts the
build, writes the outcome to ``STATUS`` in the state directory (named by ``STATE_ENV``, which the
workers inherit), and stops the engine when every worker is done. The worker that runs the compose
test reads the outcome from that file.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from simulations.deploy.compose_run import build_images, start_engine, stop_engine

STATE_ENV = "FEDGAN_TEST_DOCKERD_STATE"
STATUS = "prebuild.json"


def state_dir() -> Path:
    """This session's engine directory (short: a unix socket path has a length limit)."""
    return Path(os.environ.setdefault(STATE_ENV, f"/tmp/fedgan-dockerd-{os.getpid()}"))


class Prebuild:
    """Owned by the session's long-lived process: starts the engine and the build, stops both."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._env: dict[str, str] | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        state = state_dir()
        shutil.rmtree(state, ignore_errors=True)
        self._thread = threading.Thread(target=self._run, args=(state,), name="compose-prebuild", daemon=True)
        self._thread.start()

    def _run(self, state: Path) -> None:
        status: dict = {"env": None, "skip_reason": "", "error": "", "build_s": 0.0}
        if os.geteuid() != 0:
            status["skip_reason"] = "no Docker engine can start: dockerd is started by hand here and needs root"
        elif shutil.which("dockerd") is None or shutil.which("docker") is None:
            status["skip_reason"] = "no Docker engine can start: dockerd/docker missing (apt-get install docker.io)"
        else:
            try:
                self._env = start_engine(state, dict(os.environ))
            except Exception as err:  # noqa: BLE001 - dockerd did not come up: the one reason to skip
                log = state / "dockerd.log"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                status["skip_reason"] = f"no Docker engine can start here: {err}\n{tail}"
            else:
                t0 = time.monotonic()
                try:
                    build_images(self._env)
                    status["env"] = self._env
                except Exception as err:  # noqa: BLE001 - reported by the test that needs it
                    status["error"] = str(err)
                status["build_s"] = time.monotonic() - t0
        state.mkdir(parents=True, exist_ok=True)
        tmp = state / (STATUS + ".part")
        tmp.write_text(json.dumps(status))
        tmp.replace(state / STATUS)

    def stop(self) -> None:
        """Stop the engine (and whatever it runs) once the build is over."""
        if self._thread is None:
            return
        self._thread.join(1500)
        state = state_dir()
        if self._env is not None:
            stop_engine(state, self._env)
        shutil.rmtree(state, ignore_errors=True)
        self._thread = None


def wait(timeout_s: float = 1500) -> tuple[dict[str, str], float]:
    """In whichever process runs the compose test: the engine's environment once the images are
    built, and how long the build took; skips with the reason where no engine could start."""
    status_file = state_dir() / STATUS
    deadline = time.monotonic() + timeout_s
    while not status_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no engine and images within {timeout_s:.0f} s ({status_file} never written)")
        time.sleep(0.5)
    status = json.loads(status_file.read_text())
    if status["skip_reason"]:
        pytest.skip(status["skip_reason"])
    if status["error"]:
        raise RuntimeError(f"building the images failed: {status['error']}")
    return status["env"], status["build_s"]


PREBUILD = Prebuild()
