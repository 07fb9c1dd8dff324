"""The compose test's Docker engine and images, prepared in the background while other tests run.

Building the images on a clean machine takes ~2 minutes, mostly waiting on the network, dpkg and
layer unpacking rather than the CPU, so ``tests/conftest.py`` starts it as soon as the compose test
is collected and runs that test last; the test then waits for the build (and fails with its
output if it failed). Where no engine can start (not root, no dockerd), the reason is kept and the
test is skipped with it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from simulations.deploy.compose_run import build_images, start_engine, stop_engine


class Prebuild:
    def __init__(self) -> None:
        self.state = Path(f"/tmp/fedgan-dockerd-{os.getpid()}")  # short: unix socket paths are limited
        self.env: dict[str, str] | None = None
        self.skip_reason = ""
        self.error: BaseException | None = None
        self.build_s = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        if os.geteuid() != 0:
            self.skip_reason = "no Docker engine can start: dockerd is started by hand here and needs root"
        elif shutil.which("dockerd") is None or shutil.which("docker") is None:
            self.skip_reason = "no Docker engine can start: dockerd/docker missing (apt-get install docker.io)"
        if self.skip_reason:
            self._done.set()
            return
        self._thread = threading.Thread(target=self._run, name="compose-prebuild", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.env = start_engine(self.state, dict(os.environ))
            t0 = time.monotonic()
            build_images(self.env)
            self.build_s = time.monotonic() - t0
        except BaseException as err:  # noqa: BLE001 - reported by the test that needs it
            self.error = err
        finally:
            self._done.set()

    def wait(self, timeout_s: float = 1500) -> dict[str, str]:
        """The engine's environment once the images are built."""
        self.start()
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"the engine and images were not ready within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"starting the engine or building the images failed: {self.error}") from self.error
        return self.env

    def stop(self) -> None:
        """Stop the engine (and whatever it runs); waits for a build still going."""
        if self._thread is None:
            return
        self._done.wait(1500)
        if self.env is not None:
            stop_engine(self.state, self.env)
        shutil.rmtree(self.state, ignore_errors=True)
        self._thread = None


PREBUILD = Prebuild()
