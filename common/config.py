"""The experiment configuration's parts: the run's options, the composer, and the TOML loader.

``ExperimentConfig``, the one configuration and source of truth for CLI flags, TOML files and
Flower's run_config, is composed by the registry (``common/methods/__init__.py``) from the options
every run has (``RunOptions``, below) and each registered method's own section (its
``options.py``), with ``compose_config``: a new method brings its options with it, and this module
never needs to know which methods there are (it is handed the sections and their checks). Every
field carries its help text in ``metadata["help"]``, so the CLI (``simulations/cli.py``), the TOML
loader and the Flower run_config mapping are all generated from the fields and cannot drift apart.
Validation runs in ``__post_init__`` (this module's checks, then the sections' checks it was
handed) so an invalid value fails before any work starts, with a message naming the field and the
value. ``config.json`` holds exactly these fields, sorted by name.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self

from common.options import ConfigError, check_finite
from common.run_options import RunOptions, validate_run_options

__all__ = ["ConfigError", "RunOptions", "compose_config", "field_help", "load_toml_values"]


class _Config:
    """What every composed configuration can do (a mixin of ``ExperimentConfig``)."""

    def __post_init__(self) -> None:
        for section in type(self).__mro__:
            if dataclasses.is_dataclass(section) and section is not type(self):
                check_finite(self, section)
        validate_run_options(self, noise_fields(type(self)))
        self._check_sections(self)

    @staticmethod
    def _check_sections(config: Any) -> None:
        """The sections' own checks, handed to ``compose_config``."""

    # --- conversions ---------------------------------------------------------------------------
    def participants(self) -> list[int]:
        """Client ids that may be sampled: ``client_subset`` if given, else all of them."""
        if not self.client_subset.strip():
            return list(range(self.num_clients))
        return sorted({int(part) for part in self.client_subset.split(",") if part.strip()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_run_config(self) -> dict[str, Any]:
        """Flower run_config keys are the field names with dashes (Flower's convention)."""
        return {name.replace("_", "-"): value for name, value in self.to_dict().items()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, source: str = "config") -> Self:
        """Build from a dict with field names in dash or underscore form; unknown keys are errors."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"{source}: unknown key {key!r}")
            kwargs[name] = _coerce(known[name], value, source)
        return cls(**kwargs)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Self:
        known = {f.name.replace("_", "-") for f in fields(cls)}
        return cls.from_mapping({k: v for k, v in run_config.items() if k in known}, source="run_config")

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> Self:
        """The file's values, with ``overrides`` (the command line's flags) on top."""
        values = load_toml_values(path)
        refuse_noise_with_target(cls, {str(path): values, "command line": overrides})
        values.update(overrides)
        return cls.from_mapping(values, source=str(path))

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


def compose_config(
    sections: tuple[type, ...],
    check_sections: Callable[[Any], None],
    *,
    fields: dict[str, tuple[str, Any]],
    module: str,
) -> type:
    """``ExperimentConfig``: the run's options first, then each method's section (the registry hands
    them over, with their checks and ``fields``, name -> (type, option), that only the registry can
    write: ``strategy``, which names the methods, and help texts that list them); ``module`` is where
    the class lives, so that it pickles. A field of ``fields`` keeps its place in the order."""
    namespace = {
        "__doc__": "Resolved options of one run (``config.json`` in the run directory holds exactly these).",
        "__module__": module,
        "__qualname__": "ExperimentConfig",
        "__annotations__": {name: kind for name, (kind, _) in fields.items()},
        **{name: value for name, (_, value) in fields.items()},
        "_check_sections": staticmethod(check_sections),
    }
    cls = type("ExperimentConfig", (_Config, *reversed(sections), RunOptions), namespace)
    return dataclass(frozen=True)(cls)


def load_toml_values(path: str | Path) -> dict[str, Any]:
    """Read an experiment TOML file: top-level keys, or the keys of an ``[experiment]`` table."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
    if "experiment" not in data:
        return dict(data)
    if not isinstance(data["experiment"], dict):
        raise ConfigError(f"config file {path}: 'experiment' must be a table ([experiment]), not a value")
    beside = sorted(k for k in data if k != "experiment")
    if beside:
        raise ConfigError(
            f"config file {path}: keys {', '.join(beside)} stand outside the [experiment] table and would be "
            "ignored; move them into it"
        )
    return dict(data["experiment"])


@functools.cache
def noise_fields(config_cls: type) -> tuple[str, ...]:
    """Every method's noise multiplier (``noise_multiplier``, ``dpgan_noise_multiplier``, ...): what
    ``target_epsilon`` calibrates (``fedgan compare`` calibrates each method's own)."""
    return tuple(f.name for f in fields(config_cls) if f.name.endswith("noise_multiplier"))


def refuse_noise_with_target(config_cls: type, layers: Mapping[str, Mapping[str, Any]]) -> None:
    """ConfigError when the user gave ``target_epsilon`` (> 0) and a noise multiplier: the calibrated
    noise would silently replace the one typed, so neither is guessed to win. ``layers``: where the
    values came from (a TOML file, the command line) -> the keys given there, dash or underscore form.
    Not applied to config.json or Flower's run_config, which hold every key (the target wins there)."""
    given = {
        key.replace("-", "_"): (source, value) for source, values in layers.items() for key, value in values.items()
    }
    target = given.get("target_epsilon")
    if target is None or not isinstance(target[1], (int, float)) or target[1] <= 0:
        return
    for name in noise_fields(config_cls):
        if name in given:
            (t_source, t_value), (n_source, n_value) = target, given[name]
            raise ConfigError(
                f"target_epsilon={t_value!r} ({t_source}) and {name}={n_value!r} ({n_source}) are both given: "
                "target-epsilon calibrates the noise multiplier itself; give one or the other"
            )


def field_help(config_cls: type, name: str) -> str:
    return next(f.metadata["help"] for f in fields(config_cls) if f.name == name)


_FIELD_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _coerce(f: dataclasses.Field, value: Any, source: str) -> Any:
    """TOML and run_config values arrive typed; accept int for float, reject everything else."""
    want = _FIELD_TYPES[f.type] if isinstance(f.type, str) else f.type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: {f.name} must be {want.__name__}, got {value!r}")
    return value
