"""The report's "Privacy audit" section: ``fedgan audit``'s figures as rows, and audit.json read so
that a garbled file is noted on the page instead of failing the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.evaluation.report_text import number as _num


def audit_rows(audit: dict) -> list[tuple[str, str]]:
    """``fedgan audit``'s figures (audit.json) as rows: the ledger's ε beside what the canaries showed."""
    rows = [
        (
            "canaries",
            f"{audit['canaries']} ({audit['inserted']} inserted), {audit['releases_per_canary']} release(s) each",
        ),
        ("ledger ε (what the canaries' ledgers print)", _num(audit.get("epsilon_ledger"))),
        ("ε of the Gaussian curve the ledger claims", _num(audit.get("epsilon_gaussian_exact"))),
        (
            f"audited lower bounds ({audit['confidence']:.0%} confidence, δ = {audit['delta']:g})",
            f"one-run {_num(audit['epsilon_one_run'], '.3g')} · Clopper–Pearson "
            f"{_num(audit['epsilon_clopper_pearson'], '.3g')} · "
            f"Gaussian {_num(audit['epsilon_gaussian_lower'], '.3g')}",
        ),
        ("attack", f"TPR {audit['tpr']:.3f} at FPR {audit['fpr']:.3f}"),
        ("verdict", "VIOLATED: a lower bound exceeds the ledger's ε" if audit["violated"] else "consistent"),
    ]
    member = audit.get("membership")
    if member:
        rows.append(("black box (nearest generated sample)", f"AUC {member['auc']:.3f}"))
    return rows


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or a ValueError naming the file (the parser's own message names none)."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is corrupt: {err}") from err


def read_audit(path: Path) -> dict | None:
    """audit.json for the report's audit section; one that cannot be read is noted there
    (``{"unreadable": why}``) instead of failing the report, which `fedgan evaluate` writes after
    all its work; the file is kept as it is (`fedgan audit` rewrites it)."""
    if not path.is_file():
        return None
    try:
        audit = read_json(path)
        if not isinstance(audit, dict):
            raise ValueError(f"{path} is corrupt: it holds a {type(audit).__name__}, not an object")
        audit_rows(audit)  # every figure the section shows is there
    except ValueError as err:
        reason = str(err)
    except KeyError as err:
        reason = f"{path} is incomplete (no {err.args[0]})"
    except TypeError as err:
        reason = f"{path} is malformed ({err})"
    else:
        return audit
    return {"unreadable": f"{reason}; run `fedgan audit` again to rewrite it"}
