"""Progress bars that suit where they are written: live on a terminal, a few lines in a log.

tqdm redraws up to ten times a second; on a terminal that is one line, but in a CI log or a file
(``make run > log``) every redraw is a new line, one per step. Off a terminal the bar updates at
most every ``LOG_INTERVAL_S`` seconds.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

LOG_INTERVAL_S = 10.0


def progress_bar(**kwargs: Any) -> tqdm:
    """``tqdm(**kwargs)`` writing to stderr, throttled when stderr is not a terminal."""
    stream = kwargs.setdefault("file", sys.stderr)
    if not getattr(stream, "isatty", lambda: False)():
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", LOG_INTERVAL_S * 3)
    return tqdm(**kwargs)
