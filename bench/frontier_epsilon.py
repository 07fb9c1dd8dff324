"""Every ε a frontier point states, from its run's privacy.json: the headline as printed, as
``PrivacyLedger`` recomputes it, and as dp-accounting does (``frontier.py`` refuses a point whose
printed ε does not recompute)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from common.channels.secure_server import KIND_SECURE_SUM  # privacy.json's epsilon_kind of a secure run
from common.methods import method
from common.privacy import PrivacyLedger

ROOT = Path(__file__).resolve().parents[1]
SECURE_UNIT = "per-client, server runs the secure sum"


def headline_ledgers(strategy: str, privacy: dict[str, Any]) -> tuple[list[dict], list[float | None]]:
    """The ledgers behind a strategy's headline ε in privacy.json, and the ε printed for each.

    A method whose clients are unbounded against the server (Fed-Avg's raw deltas) headlines the
    server's own ledger; the others headline their clients' ledgers (the largest one counts).
    """
    if method(strategy).unbounded_against_server and not privacy.get("epsilon_kind", "").startswith(KIND_SECURE_SUM):
        amplified = privacy["epsilon_amplified"]
        return [amplified["ledger"]], [amplified["epsilon"]]
    queried = [c for c in privacy["clients"] if c["queries"]]
    return [c["ledger"] for c in queried], [c["epsilon"] for c in queried]


def _largest(values: list[float | None]) -> float | None:
    """The largest ε, None when there is none or one is unbounded (privacy.json's null, or inf)."""
    return None if not values or any(v is None or math.isinf(v) for v in values) else max(values)


def reported_epsilon(strategy: str, privacy: dict[str, Any]) -> float | None:
    return _largest(headline_ledgers(strategy, privacy)[1])


def recomputed_epsilon(strategy: str, privacy: dict[str, Any]) -> float | None:
    """The headline ε recomputed from privacy.json's ledgers with ``PrivacyLedger`` (RDP)."""
    ledgers, _ = headline_ledgers(strategy, privacy)
    return _largest([PrivacyLedger.from_state_dict(ledger).epsilon(delta=privacy["delta"]) for ledger in ledgers])


def dp_accounting_epsilon(strategy: str, privacy: dict[str, Any]) -> float | None:
    """dp-accounting's RDP ε of the same ledgers (None where it is not installed or unbounded). It has
    no Skellam: a secure sum's events are taken as the Gaussian of the same multiplier, the limit the
    Skellam's ε approaches from above (a lower cross-check, within 1% at the μ our plans use)."""
    try:
        sys.path.insert(0, str(ROOT / "tests" / "integration"))
        from test_accounting_crosscheck import independent_rdp  # the test suite's independent recomputation
    except ImportError:
        return None
    ledgers, _ = headline_ledgers(strategy, privacy)
    return _largest([independent_rdp(ledger, privacy["delta"]) for ledger in ledgers])
