"""What the round loop says while it runs: the progress bar's status line, and notes that are
bounded in length and counted, not repeated, when the same one recurs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from tqdm import tqdm

from common.io.progress import LOG_INTERVAL_S


def status_line(bar: tqdm) -> Callable[[str], None]:
    """What a step is doing now, on the progress bar: drawn at once, at most every second on a
    terminal and every ``LOG_INTERVAL_S`` in a log (a secure sum's rounds of a large cohort take
    minutes: the bar says which, instead of a silent 0%)."""
    stream = getattr(bar, "fp", None)  # a disabled bar has none
    every = 1.0 if getattr(stream, "isatty", lambda: False)() else LOG_INTERVAL_S
    drawn = [0.0]

    def status(text: str) -> None:
        bar.set_postfix_str(text, refresh=False)
        if time.monotonic() - drawn[0] >= every:
            drawn[0] = time.monotonic()
            bar.refresh()

    return status


def repeated(repeats: dict[str, list], note: str) -> bool:
    """Count a note whose shape (numbers masked) was seen before; True: it is a repeat, not shown."""
    seen = repeats.setdefault(re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", note), [0, note])
    seen[0] += 1
    return seen[0] > 1


def repeat_notes(repeats: dict[str, list]) -> list[str]:
    """One line per note that recurred: how often, and its first wording."""
    return [f"{count - 1} more like: {first}" for count, first in repeats.values() if count > 1]


MAX_NOTE_CHARS = 500


def bounded(text: str, limit: int = MAX_NOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was dropped."""
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit:,} more characters dropped]"
