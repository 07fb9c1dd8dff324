"""The reaper ends what the simulation started, and only that: never a process that already ran when
the watch began, nor anything such a process starts later (a test's own Ray cluster or Docker engine,
which the in-process CLI's reaper sees among its descendants). Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from simulations.deploy.processes import alive, identity
from simulations.experiments.reaper import POLL_S, watch

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
# Starts a child of its own once the watch is under way, and prints its pid.
LATE_PARENT = (
    "import subprocess, sys, time; time.sleep(1.0); "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "print(child.pid, flush=True); time.sleep(300)"
)


def test_the_reaper_ends_what_started_during_the_watch_and_spares_what_ran_before():
    before = subprocess.Popen([sys.executable, "-c", LATE_PARENT], stdout=subprocess.PIPE, text=True)
    during = None
    late_child = None
    try:
        with watch():
            during = subprocess.Popen(SLEEPER)
            late_child = identity(int(before.stdout.readline()))  # started during the watch, below `before`
            time.sleep(3 * POLL_S)  # the reaper's scans see both
        assert during.wait(timeout=15) is not None  # started during the watch: ended on leaving it
        assert before.poll() is None, "a process that ran before the watch was ended"
        assert late_child is not None and alive(late_child), "a process below a spared one was ended"
    finally:
        for proc in (before, during):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if late_child is not None and alive(late_child):
            os.kill(late_child[0], signal.SIGKILL)
