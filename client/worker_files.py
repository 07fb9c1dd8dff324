"""Where a node's data-plane worker (``worker.py``) keeps its lock and log: one of each per run and
node, so the ClientApp that starts a worker can tell whether one is running without importing it."""

from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path
from typing import BinaryIO

LOCK_DIR = Path(tempfile.gettempdir()) / "fedgan-dataplane"


def lock_path(run_id: int, node_id: int) -> Path:
    return LOCK_DIR / f"{run_id}-{node_id}.lock"


def log_path(run_id: int, node_id: int) -> Path:
    return LOCK_DIR / f"{run_id}-{node_id}.log"


def try_lock(path: Path) -> BinaryIO | None:
    """The open, exclusively locked file, or None when another worker holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "ab")  # noqa: SIM115 - held for the worker's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def is_running(run_id: int, node_id: int) -> bool:
    handle = try_lock(lock_path(run_id, node_id))
    if handle is None:
        return True
    handle.close()
    return False
