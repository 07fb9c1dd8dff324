"""What ``fedgan evaluate`` and ``fedgan audit`` read from a run directory, checked before any work:
JSON that does not parse, or a summary whose fields are not what a run writes, is named with the
file and the field (a hostile or garbled file never ends in a traceback)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from server.reporting import RunDirectory, RunDirectoryError


def read_run_summary(run: RunDirectory) -> dict[str, Any]:
    path = run.path / "summary.json"
    if not path.is_file():
        raise RunDirectoryError(f"{path} does not exist: the run has not finished (resume it first)")
    return read_summary(path)


def read_summary(path: Path) -> dict[str, Any]:
    """summary.json, checked to hold every field evaluation and the report read, with its type
    (a RunDirectoryError naming the file and the field if not)."""
    summary = read_json(path)
    missing = [k for k in SUMMARY_KEYS if not isinstance(summary, dict) or k not in summary]
    if missing:
        raise RunDirectoryError(f"{path} is incomplete (no {', '.join(missing)}): resume or rerun the run")
    wrong = _malformed_summary_field(summary)
    if wrong:
        raise RunDirectoryError(f"{path} is malformed: {wrong}; resume or rerun the run")
    return summary


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a file that is not JSON text is a RunDirectoryError naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunDirectoryError(f"{path} is corrupt: {err}") from err
    except OSError as err:
        raise RunDirectoryError(f"{path} cannot be read ({err.strerror or err})") from err


SUMMARY_KEYS = ("clients", "steps_completed", "epsilon_max", "delta")


def _malformed_summary_field(summary: dict[str, Any]) -> str:
    """The first field evaluation relies on that has the wrong type, in words ("" when none).

    First the schema (``RunSummary`` in protos/fedgan.proto), then what JSON itself must hold for
    the figures and plots computed from it: protobuf's JSON also takes "5" for an integer and
    "NaN" for a number, which arithmetic does not, and ignores a client's unknown fields, so a
    client with no queries or epsilon passes it."""
    from google.protobuf import json_format

    from protos import fedgan_pb2

    try:
        json_format.ParseDict(summary, fedgan_pb2.RunSummary(), ignore_unknown_fields=True)
    except json_format.ParseError as err:
        return str(err).splitlines()[0][:300]
    checks = [("steps_completed", summary["steps_completed"], _is_count), ("delta", summary["delta"], _is_number)]
    checks.append(("epsilon_max", summary["epsilon_max"], _is_number_or_null))
    wrong = next(
        (f"{name} is {_short(value)}, not {kind.__doc__}" for name, value, kind in checks if not kind(value)), ""
    )
    return wrong or malformed_clients(summary["clients"], numbers=CLIENT_NUMBERS)


CLIENT_NUMBERS = ("epsilon", "epsilon_rdp", "epsilon_prv", "bytes_down", "bytes_up")
CLIENT_KEYS = ("queries", "epsilon")  # what every client of summary.json and privacy.json holds


def malformed_clients(clients: Any, *, numbers: tuple[str, ...] = ("epsilon",)) -> str:
    """The first client field that evaluation or the audit reads and that is missing or of the wrong
    type, in words ("" when none): ``clients`` is a list of objects, each with its ``queries`` (a
    count) and its ``epsilon`` (null when unbounded); ``numbers``: the fields that must be numbers or null."""
    if not isinstance(clients, list):  # null passes the schema as an empty list
        return f"clients is {_short(clients)}, not a list of client objects"
    for i, client in enumerate(clients):
        if not isinstance(client, dict):
            return f"clients[{i}] is {_short(client)}, not a client object"
        missing = [k for k in CLIENT_KEYS if k not in client]
        if missing:
            return f"clients[{i}] has no {' and no '.join(missing)} (every client lists its queries and its epsilon)"
        checks = [("queries", client["queries"], _is_count)]
        checks += [(k, client.get(k), _is_number_or_null) for k in numbers]
        wrong = next(((k, v, kind) for k, v, kind in checks if not kind(v)), None)
        if wrong:
            return f"clients[{i}].{wrong[0]} is {_short(wrong[1])}, not {wrong[2].__doc__}"
    return ""


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message quotes a field, not a whole file."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(value: Any) -> bool:
    """an integer >= 0"""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    """a finite number"""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_number_or_null(value: Any) -> bool:
    """a finite number or null"""
    return value is None or _is_number(value)
