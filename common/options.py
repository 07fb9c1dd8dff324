"""What every options section is made of: a field with its help text, and checks that name the field.

The registry composes the run's options (``common/run_options.py``) and each method's section
(``common/methods/<name>/options.py``) into the one ``ExperimentConfig``; the CLI flags, TOML keys and Flower
run_config keys are generated from those fields and their help texts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import field, fields
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the value."""


def option(default: Any, help: str) -> Any:
    """A configuration field: its default and the help text of its flag, TOML key and run_config key."""
    return field(default=default, metadata={"help": help})


def check(ok: bool, name: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"invalid {name}={value!r}: {why}")


def check_choice(c: Any, name: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    check(getattr(c, name) in choices, name, getattr(c, name), f"choose one of {choices}")


def check_all(c: Any, names: Iterable[str], ok, why: str) -> None:
    """``ok(value)`` for each of ``names``, e.g. ``check_all(c, ("lr_g", "lr_d"), lambda v: v > 0, "must be > 0")``."""
    for name in names:
        check(ok(getattr(c, name)), name, getattr(c, name), why)


def check_finite(c: Any, section: type) -> None:
    """Every float field of ``section`` is a finite number (NaN and inf are never a valid setting)."""
    for f in fields(section):
        value = getattr(c, f.name)
        if isinstance(value, float):
            check(math.isfinite(value), f.name, value, "must be a finite number")
