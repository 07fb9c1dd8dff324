"""Environment variables that carry the simulated nodes' own settings, scoped to one block."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def restored_env(name: str, value: str | None = None) -> Iterator[None]:
    """``name`` set to ``value`` for the block (None: left as it is), then put back as it was: the
    simulated nodes read their policy and their place from the environment, and one command or run
    must never hand its own to the next one in the same process."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
