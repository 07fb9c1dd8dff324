"""End what a Flower simulation started, even when the CLI that started it is killed.

Ray (under Flower's simulation runtime) starts a GCS server, a raylet, a dashboard agent, a runtime
env agent and the ClientApp actors as descendants of the CLI. When the CLI ends normally, Ray stops
them all; when it is killed (SIGKILL, or SIGTERM, which Ray's own C-level handler turns into an
abort), the two agents and the ClientApp actor are left running under init and ignore SIGTERM
(measured: still running 90 s after the kill, ~190 MB each agent).
Nothing can run in a process that was SIGKILLed, so the cleanup lives in a separate small process:

- ``watch()`` starts ``python -m simulations.experiments.reaper PID`` in a session of its own with a
  pipe from the CLI on its stdin; the reaper records every descendant of PID (its pid and start
  time) each ``POLL_S``, and when the pipe closes (the CLI finished, crashed or was killed: the
  kernel closes the pipe in every case) it SIGTERMs the recorded processes that are still the same
  processes, then SIGKILLs what is left after ``GRACE_S``.
- A pid is only ever signalled while it still has the start time it had as a descendant, so a
  reused pid is never touched; the next run and ``--resume`` start their own Ray instance
  (``address="local"``) and never attach to what a killed run left.
- What the CLI's process already ran when the watch began, and everything below it, is never
  recorded: ``watch()`` lists those processes and hands them to the reaper. A program that calls the
  simulation in its own process (a test, a benchmark) may have started a Ray cluster, a Docker engine
  or anything else of its own first: those are not the simulation's to end.
- Only a local Ray instance is watched: a run on an existing cluster (``ray_address``) starts no Ray
  process and runs no reaper (``ray_cluster.py``); the cluster, whoever started it, is never touched.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from simulations.deploy.processes import Proc, alive, descendants, end, identity

POLL_S = 1.0  # how often the reaper lists the CLI's descendants (a /proc scan: about a millisecond)
SETTLE_S = 2.0  # after EOF, for processes still shutting down on their own (a normal end)
GRACE_S = 5.0  # after SIGTERM, before SIGKILL


@contextmanager
def watch() -> Iterator[subprocess.Popen]:
    """While the block runs (and after this process dies, however it dies), a reaper watches the
    processes this process starts from now on (and their descendants); on leaving the block it ends
    those still running and exits. What runs already, and what it starts, is spared."""
    spared = [f"{pid}:{start}" for pid, start in descendants([os.getpid()])]
    reaper = subprocess.Popen(
        [sys.executable, "-m", "simulations.experiments.reaper", str(os.getpid()), *spared],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C to the terminal's process group must not end it first
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        yield reaper
    finally:
        reaper.stdin.close()  # the same signal a killed CLI gives: EOF
        try:
            reaper.wait(timeout=SETTLE_S + GRACE_S + 5)
        except subprocess.TimeoutExpired:
            pass  # it keeps going on its own; never block the CLI's exit on it


def reap(
    parent: int,
    stdin_fd: int,
    *,
    spared: Collection[Proc] = (),
    poll_s: float = POLL_S,
    settle_s: float = SETTLE_S,
    grace_s: float = GRACE_S,
) -> list[Proc]:
    """Record ``parent``'s descendants, less ``spared`` and everything below them, until ``stdin_fd``
    reaches EOF, give them ``settle_s`` to exit on their own, then end the rest.

    Returns the processes that were still running after ``settle_s`` (and were signalled)."""
    seen: dict[int, Proc] = {}
    root = identity(parent)
    while True:
        if root is not None and alive(root):
            for proc in descendants([parent], prune=spared):
                if proc[0] != os.getpid():
                    seen[proc[0]] = proc
        ready, _, _ = select.select([stdin_fd], [], [], poll_s)
        if ready and not os.read(stdin_fd, 4096):
            break
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(alive(p) for p in seen.values()):
        time.sleep(0.1)
    left = [p for p in seen.values() if alive(p)]
    end(left, grace_s=grace_s)
    return left


def main(argv: list[str]) -> int:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only EOF on stdin ends the watch
    spared = [(int(pid), int(start)) for pid, start in (arg.split(":") for arg in argv[1:])]
    left = reap(int(argv[0]), sys.stdin.fileno(), spared=spared)
    if left:
        pids = ", ".join(str(p[0]) for p in left)
        print(f"fedgan: ended {len(left)} process(es) the simulation left running (pids {pids})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
