"""The run directory: resolved config, metrics (JSONL), sample grids, checkpoints, privacy, summary.

Layout (``runs/NNNNN-<strategy>-<dataset>/`` or ``--out``)::

    config.json  metrics.jsonl  privacy.json  summary.json  checkpoint.pt  samples/step-XXXXXX.png
    clients/     (per-client state files in simulation: each node's own disk in a deployment)

Every file that a crash could leave half-written is written to a temporary name and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from common.evaluation.grids import tile_images
from common.io.private_paths import CLIENT_STATE, mark_private
from common.io.tensor_files import UnsafeFileError, load_tensors, save_tensors
from common.learning.models import device_of, sample_latent
from common.methods import ExperimentConfig

CHECKPOINT = "checkpoint.pt"
FAILURE_FILE = "failure.txt"  # why a run started by `flwr run` failed (the ServerApp writes it)


class RunDirectoryError(RuntimeError):
    """The run directory is missing, incomplete or does not match what is asked of it."""


def next_run_dir(root: str | Path, cfg: ExperimentConfig, *, label: str = "") -> Path:
    """``root/NNNNN-<strategy>-<dataset>`` (``label`` instead of the strategy when given) with NNNNN one
    above the highest number present."""
    root = Path(root)
    with _unwritable(root, "the runs folder (or give --out)"):
        root.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in root.iterdir() if (m := re.match(r"(\d{5})-", p.name))]
    return root / f"{max(numbers, default=-1) + 1:05d}-{label or cfg.strategy}-{cfg.dataset}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with disk_errors(path, tmp):
        tmp.write_bytes(data)
        os.replace(tmp, path)


@contextlib.contextmanager
def disk_errors(path: Path, tmp: Path | None = None, *, appended: bool = False):
    """A write that fails leaves the previous file intact (the temporary one, if any, is removed)
    and says which file and why, e.g. "no space left on device writing .../checkpoint.pt (12 KiB
    free on its file system); the previous version is intact". ``appended``: written in place."""
    try:
        yield
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise RunDirectoryError(f"{write_failure(err, path)}; {_what_is_left(path, appended)}") from err


def write_failure(err: OSError, path: Path) -> str:
    """Why writing ``path`` failed, in words: a full disk says how much room is left where."""
    if err.errno == errno.ENOSPC:
        return f"no space left on device writing {path}{_free_space(path.parent)}"
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path} ({err.strerror}): use a writable directory"
    return f"{err.strerror or err} writing {path}"


def _free_space(folder: Path) -> str:
    try:
        stats = os.statvfs(folder)
    except OSError:
        return ""
    return f" ({stats.f_bavail * stats.f_frsize / 1024:,.0f} KiB free on its file system)"


def _what_is_left(path: Path, appended: bool) -> str:
    if appended:  # metrics.jsonl: a torn last line is dropped when it is read
        return "what it held before is kept"
    return "the previous version is intact" if path.exists() else "no earlier version of it exists"


def atomic_write_json(path: Path, obj: Any) -> None:
    text = json.dumps(finite_json(obj), indent=2, sort_keys=True, default=_json_default, allow_nan=False)
    atomic_write_bytes(path, (text + "\n").encode())


def finite_json(obj: Any) -> Any:
    """Strict JSON: an infinite or undefined number (ε with σ=0) becomes null, never Infinity/NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def first_line(err: BaseException) -> str:
    """A short reason: torch's own message for a file that is not a checkpoint runs to ten lines."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:200]


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


STATE_DIR_FILE = "state_dir.txt"
DEPLOY_DIR = "deploy"  # `fedgan deploy` keeps its processes' logs and keys here, made before the run


def check_new_run_dir(path: Path) -> None:
    """A new run may start in ``path``: it holds no run and nothing else (but ``fedgan deploy``'s
    own ``deploy/`` folder, made before the ServerApp creates the run)."""
    if path.exists() and not path.is_dir():
        raise RunDirectoryError(f"--out {path} is a file, not a directory: choose another --out")
    if (path / CHECKPOINT).exists():
        raise RunDirectoryError(
            f"{path} already holds a run; use --resume {path} to continue it or choose another --out"
        )
    if path.exists() and any(p.name != DEPLOY_DIR for p in path.iterdir()):
        # A run that died before its first checkpoint leaves client state (and spent privacy)
        # behind; a new run must not silently inherit it.
        raise RunDirectoryError(
            f"{path} is not empty (a run that stopped before its first "
            "checkpoint? its clients/ keeps the privacy the clients spent): choose "
            "another --out"
        )


def check_writable(path: Path, what: str) -> None:
    """Fail now, not after the work, when ``path`` (made if missing) cannot take a file: a real write
    attempt, since root ignores permission bits and only the write itself tells a read-only mount."""
    with _unwritable(path, what):
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".fedgan-write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)


@contextlib.contextmanager
def _unwritable(path: Path, what: str):
    """An OSError while making or writing ``path`` as a RunDirectoryError naming it and ``what`` it is for."""
    try:
        yield
    except OSError as err:
        raise RunDirectoryError(f"cannot write to {path} ({err.strerror or err}): {what}") from err


_HELD_LOCKS: dict[Path, Any] = {}  # run directory -> the open, locked file (held until the process exits)
LOCK_FILE = ".lock"
RESUME_KEYS = ("strategy", "step", "wall_s", "comm")


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()

    def lock(self) -> None:
        """Become the only process driving this run directory (an exclusive lock on ``.lock``, held
        until this process exits; taking it twice in one process is a no-op). Two writers would
        interleave checkpoints and lose ledger entries, so a second one is refused, naming the holder."""
        if self.path in _HELD_LOCKS:
            return
        with _unwritable(self.path, "a run directory must be writable to be continued (copy it somewhere writable)"):
            handle = open(self.path / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunDirectoryError(
                f"run directory {self.path} is in use by another fedgan process (pid {holder}); wait for it "
                "to finish or stop it before resuming"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        _HELD_LOCKS[self.path] = handle

    def unlock(self) -> None:
        """Let another process drive this run directory (the end of a run, or a CLI call in a test)."""
        handle = _HELD_LOCKS.pop(self.path, None)
        if handle is not None:
            handle.close()  # closing the file releases the lock

    @classmethod
    def create(cls, cfg: ExperimentConfig, *, state_dir: str | Path | None = None) -> RunDirectory:
        """A new run directory; ``state_dir`` lets several runs share the clients' state (and so
        their ledgers), as the debugging task's selection and training runs do."""
        path = Path(cfg.out) if cfg.out else next_run_dir("runs", cfg)
        check_new_run_dir(path)
        run = cls(path)
        with _unwritable(run.path, "choose a writable --out"):
            (run.path / "samples").mkdir(parents=True, exist_ok=True)
            mark_private(run.path / "clients", CLIENT_STATE)  # empty in a deployment: each node keeps its own
            if state_dir is not None:
                mark_private(state_dir, CLIENT_STATE)
        atomic_write_json(run.path / "config.json", cfg.to_dict())
        if state_dir is not None:
            atomic_write_bytes(run.path / STATE_DIR_FILE, str(Path(state_dir).resolve()).encode())
        return run

    @classmethod
    def open_existing(cls, path: str | Path) -> tuple[RunDirectory, ExperimentConfig]:
        run = cls(path)
        cfg_path = run.path / "config.json"
        if not run.path.is_dir():
            raise RunDirectoryError(f"run directory {run.path} does not exist")
        if not cfg_path.is_file():
            raise RunDirectoryError(f"{run.path} has no config.json: not a fedgan run directory")
        try:
            values = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RunDirectoryError(f"{cfg_path} is corrupt: {err}") from err
        if not isinstance(values, dict):
            raise RunDirectoryError(f"{cfg_path} is corrupt: it holds a {type(values).__name__}, not a config object")
        return run, ExperimentConfig.from_mapping(values, source=str(cfg_path))

    # --- files -----------------------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        shared = self.path / STATE_DIR_FILE
        return Path(shared.read_text().strip()) if shared.exists() else self.path / "clients"

    def append_metrics(self, record: dict[str, Any]) -> None:
        line = json.dumps(finite_json(record), sort_keys=True, default=_json_default, allow_nan=False) + "\n"
        with disk_errors(self.path / "metrics.jsonl", appended=True), open(self.path / "metrics.jsonl", "a") as fh:
            fh.write(line)

    def truncate_metrics(self, after_step: int) -> None:
        """On resume, drop metric lines written after the checkpoint being resumed."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        keep = [line for line, record in self._metric_lines() if record.get("step", 0) <= after_step]
        atomic_write_bytes(path, ("\n".join(keep) + "\n" if keep else "").encode())

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metric records, skipping a torn line (a process killed mid-write leaves one)."""
        return [record for _, record in self._metric_lines()]

    def _metric_lines(self) -> list[tuple[str, dict[str, Any]]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        lines = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                record = None  # torn or garbled: dropped (resume rewrites the file without it)
            if isinstance(record, dict):
                lines.append((line, record))
        return lines

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        with disk_errors(self.path / CHECKPOINT):
            save_tensors(state, self.path / CHECKPOINT)

    def resumable_checkpoint(self) -> dict[str, Any]:
        """The checkpoint, checked to hold what a resume needs (a clear error otherwise)."""
        ck = self.load_checkpoint()
        missing = [k for k in RESUME_KEYS if not isinstance(ck, dict) or k not in ck]
        if missing:
            raise RunDirectoryError(
                f"{self.path / CHECKPOINT} lacks {', '.join(missing)}: it cannot be resumed (start a new run)"
            )
        return ck

    def load_checkpoint(self) -> dict[str, Any]:
        path = self.path / CHECKPOINT
        if not path.exists():
            raise RunDirectoryError(
                f"{path} does not exist: nothing to resume (the run stopped before its first checkpoint, "
                "which is written before any client releases anything; start it again with another --out)"
            )
        try:
            return load_tensors(path)
        except UnsafeFileError as err:
            raise RunDirectoryError(str(err)) from err
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same failure for the user
            raise RunDirectoryError(f"{path} is corrupt ({first_line(err)}); it cannot be read") from err

    def save_snapshot(self, step: int, generator_state: dict, privacy: dict[str, float]) -> Path:
        """``snapshots/step-XXXXXX.pt``: the released generator at ``step`` and ε spent by then."""
        folder = self.path / "snapshots"
        folder.mkdir(exist_ok=True)
        path = folder / f"step-{step:06d}.pt"
        with disk_errors(path):
            save_tensors({"step": step, "generator": generator_state, "privacy": privacy}, path)
        return path

    def load_snapshot(self, path: Path) -> dict[str, Any]:
        """A snapshot's content (tensors and plain data only; a clear error naming it otherwise)."""
        try:
            return load_tensors(path)
        except UnsafeFileError as err:
            raise RunDirectoryError(str(err)) from err
        except Exception as err:  # noqa: BLE001 - any unreadable snapshot is the same failure for the user
            raise RunDirectoryError(f"snapshot {path} is corrupt ({first_line(err)}); delete it or rerun") from err

    def snapshots(self) -> list[Path]:
        folder = self.path / "snapshots"
        return sorted(folder.glob("step-*.pt")) if folder.is_dir() else []

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_json(self.path / name, obj)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_bytes(self.path / name, text.encode())

    def save_samples(
        self,
        generator: torch.nn.Module,
        step: int,
        *,
        num_classes: int,
        z_dim: int,
        per_class: int = 10,
        seed: int = 1234,
    ) -> Path:
        """A grid with one row per class, from fixed latents so grids are comparable over steps."""
        grid = sample_grid(generator, num_classes=num_classes, z_dim=z_dim, per_class=per_class, seed=seed)
        path = self.path / "samples" / f"step-{step:06d}.png"
        buf = path.with_name(path.name + ".tmp")
        with disk_errors(path, buf):
            Image.fromarray(grid).save(buf, format="PNG")
            os.replace(buf, path)
        return path


@torch.no_grad()
def sample_grid(
    generator: torch.nn.Module, *, num_classes: int, z_dim: int, per_class: int = 10, seed: int = 1234, pad: int = 2
) -> np.ndarray:
    rng = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    was_training = generator.training
    generator.eval()
    device = device_of(generator)
    images = generator(sample_latent(len(labels), z_dim, generator=rng).to(device), labels.to(device))
    generator.train(was_training)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return tile_images(pixels, rows=num_classes, pad=pad)
