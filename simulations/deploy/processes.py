"""Start and stop the deployment's processes, and only those.

Flower's SuperLink and SuperNodes spawn SuperExec processes (some in sessions of their own) that
spawn ServerApp and ClientApp processes, so stopping "what we started" means the started processes
and every descendant, identified by (pid, start time) so a reused pid is never signalled. Zombies
fool ``os.kill(pid, 0)``, so liveness is read from /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from /proc, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def identity(pid: int) -> Proc | None:
    stat = _stat(pid)
    return None if stat is None else (pid, stat[2])


def alive(proc: Proc) -> bool:
    """Running (not a zombie) and still the same process."""
    stat = _stat(proc[0])
    return stat is not None and stat[0] not in ("Z", "X") and stat[2] == proc[1]


def descendants(roots: list[int], *, prune: Collection[Proc] = ()) -> list[Proc]:
    """Every live process below ``roots`` (children, grandchildren, ...), leaving out each process of
    ``prune`` and everything below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, todo, pruned = [], list(roots), set(prune)
    while todo:
        for child in children.get(todo.pop(), []):
            if (proc := identity(child)) is not None and proc not in pruned:
                found.append(proc)
                todo.append(child)
    return found


def spawn(
    args: list[str], *, log: Path, env: dict[str, str], cwd: Path | None = None, stdin: bytes | None = None
) -> subprocess.Popen:
    """Start ``args`` in its own session with stdout and stderr to ``log``."""
    handle = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen(
        args,
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        start_new_session=True,
    )
    handle.close()
    if stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.close()
    return proc


def terminate(started: list[subprocess.Popen], *, grace_s: float = 10.0) -> list[Proc]:
    """SIGTERM every started process and its descendants, SIGKILL what is left after ``grace_s``.

    Returns the processes that had to be killed."""
    targets = [p for p in (identity(s.pid) for s in started) if p is not None]
    targets += descendants([s.pid for s in started])

    def reap() -> None:
        for s in started:
            s.poll()  # reap our direct children so they do not linger as zombies

    killed = end(targets, grace_s=grace_s, reap=reap)
    for s in started:
        try:
            s.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return killed


def end(targets: list[Proc], *, grace_s: float, reap: Callable[[], None] = lambda: None) -> list[Proc]:
    """SIGTERM ``targets`` that are still the same processes, SIGKILL those left after ``grace_s``
    (``reap`` runs while waiting). Returns the ones that had to be killed."""
    for proc in targets:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in targets):
        reap()
        time.sleep(0.1)
    killed = [p for p in targets if alive(p)]
    for proc in killed:
        _signal(proc, signal.SIGKILL)
    return killed


def _signal(proc: Proc, signum: int) -> None:
    if alive(proc):
        try:
            os.kill(proc[0], signum)
        except (ProcessLookupError, PermissionError):
            pass
