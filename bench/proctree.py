"""A process and everything it started, read from /proc: the tree, its memory, its CPU time.

``bench/scale.py`` runs each arm in a child process whose descendants (Ray's workers, ClientApps)
do the work; these helpers follow the whole tree, sampled while it runs.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SAMPLE_EVERY_S = 0.5


def _children_of() -> dict[int, list[int]]:
    """ppid -> pids, for every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (Ray's raylet, GCS and workers descend from the driver)."""
    tree, out, todo = _children_of(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _rss_pss_bytes(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process from smaps_rollup; zeros when it has gone."""
    values = {"Rss:": 0, "Pss:": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(" ")
                if key in values:
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values["Rss:"], values["Pss:"]


class TreeSampler(threading.Thread):
    """Peak summed RSS and PSS of a process tree, sampled every ``SAMPLE_EVERY_S``."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak_rss = self.peak_pss = self.peak_processes = 0
        self.peak_by_process: dict[str, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_EVERY_S):
            self.sample()

    def sample(self) -> None:
        pids = process_tree(self.root)
        sizes = {pid: _rss_pss_bytes(pid) for pid in pids}
        rss, pss = sum(r for r, _ in sizes.values()), sum(p for _, p in sizes.values())
        self.peak_processes = max(self.peak_processes, len(pids))
        if pss > self.peak_pss:
            self.peak_by_process = {f"{pid} {_comm(pid)}": p for pid, (_, p) in sizes.items()}
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (Ray's workers included)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / tick
