"""Files of tensors and plain data (checkpoints, snapshots, client state): read without running code,
written so that a failed write leaves the previous file as it was.

A pickle may name any callable for the unpickler to run: ``torch.load(weights_only=False)`` on a
``checkpoint.pt`` from someone else's run directory ran a pickled ``os.system``. Every ``.pt`` file
the project reads therefore goes through ``load_tensors`` (``weights_only=True``: tensors, dicts,
lists, tuples, numbers, strings, None and torch's own state objects), and what the project writes
keeps to those types, so no allow-list of further classes is needed.

``save_tensors`` writes ``<name>.tmp`` and renames it over the target. torch reports a failed write
(a full disk) as ``RuntimeError("[enforce fail at inline_container.cc...] unexpected pos ...")``,
which names neither the cause nor the file; writing through a Python file object keeps the
``OSError`` (ENOSPC, EROFS, ...) in its context, and that ``OSError`` is what callers see, with the
temporary file removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

__all__ = ["UnsafeFileError", "load_tensors", "save_tensors"]


class UnsafeFileError(ValueError):
    """A file holds more than tensors and plain data: loading it in full could run code."""


def load_tensors(path: str | Path, *, mmap: bool = False) -> Any:
    """The content of ``path``, tensors and plain data only (on the CPU). A file that names any
    other class or function is refused with ``UnsafeFileError`` before anything in it runs; other
    damage raises what torch raises, an UnpicklingError in one line (callers name the file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        named = re.search(r"GLOBAL ([\w.]+)", str(err))  # torch: "... unsupported GLOBAL posix.system ..."
        if named:
            raise UnsafeFileError(
                f"{path} holds a reference to {named.group(1)}, not only tensors and plain data: refused, "
                "since loading it could run code (only open files you made yourself with fedgan)"
            ) from err
        # Garbage, or a pickle of another kind: refused all the same, in one line instead of torch's ten.
        detail = next((line.strip() for line in str(err).splitlines() if line.strip().startswith("Unsupported")), "")
        raise pickle.UnpicklingError(
            f"not tensors and plain data as fedgan writes them{f' ({detail})' if detail else ''}"
        ) from err


def save_tensors(obj: Any, path: str | Path) -> None:
    """Write ``obj`` to ``path`` atomically; a failure removes the temporary file, leaves ``path`` as
    it was, and raises the ``OSError`` behind it (its errno says which: ENOSPC for a full disk)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
        os.replace(tmp, path)
    except OSError:
        _discard(tmp)
        raise
    except RuntimeError as err:  # torch's wrapper of a failed write
        _discard(tmp)
        raise _os_error_behind(err, tmp) from err


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()


def _os_error_behind(err: BaseException, path: Path) -> OSError:
    """The ``OSError`` that made torch's write fail (its ``__context__``), else one saying what torch said."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return OSError(seen.errno, seen.strerror, str(path))
        seen = seen.__cause__ or seen.__context__
    first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return OSError(errno.EIO, f"write failed ({first[:200]})", str(path))
