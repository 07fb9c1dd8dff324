"""Rewrite pyproject.toml's ``[tool.flwr.app.config]`` from ``ExperimentConfig``'s defaults.

``flwr run .`` reads that table; a test keeps it equal to the dataclass. After adding or changing a
config field run ``python -m simulations.devtools.flwr_config``.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.methods import ExperimentConfig

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
HEADER = "[tool.flwr.app.config]"


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def render() -> str:
    lines = [HEADER] + [f"{k} = {toml_value(v)}" for k, v in ExperimentConfig().to_run_config().items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    text = PYPROJECT.read_text()
    PYPROJECT.write_text(text[: text.index(HEADER)] + render())
    print(f"rewrote {HEADER} in {PYPROJECT}")


if __name__ == "__main__":
    main()
