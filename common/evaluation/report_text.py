"""How the report writes a value: HTML-escaped text, and a number or "n/a" where it is missing or
not finite (a figure never prints as nan)."""

from __future__ import annotations

import html
from typing import Any

from common.evaluation.plots import finite_or_none


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any, fmt: str = ".4g") -> str:
    v = finite_or_none(value)
    return "n/a" if v is None else format(v, fmt)
