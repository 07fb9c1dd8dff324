"""How the report writes a value: HTML-escaped text, and a number or "n/a" where it is missing or
not finite (a figure never prints as nan); a run's wall time as the table and the report both say it."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from common.evaluation.plots import finite_or_none


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any, fmt: str = ".4g") -> str:
    v = finite_or_none(value)
    return "n/a" if v is None else format(v, fmt)


def wall_text(wall: Any, before: Any, seconds: Callable[[float], str]) -> str:
    """A run's wall time (``seconds`` writes one), and a seeded run's whole one beside it: its loop alone
    leaves out what came before it (``prior_wall_s``: the seed stage's deposits, sums and fit, the
    server's critic)."""
    w, b = finite_or_none(wall), finite_or_none(before)
    if w is None:
        return "n/a"
    if not b:
        return seconds(w)
    return f"{seconds(w)}; {seconds(w + b)} with the {seconds(b)} before it (the seed stage and its critic)"
