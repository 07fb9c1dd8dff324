"""Privacy statement: generated from the ledgers, names δ, accountants and both rules."""

from __future__ import annotations

import math

import pytest

from common.privacy import (
    ACCOUNTING_RULE_AMPLIFIED,
    ACCOUNTING_RULE_PER_CLIENT,
    PrivacyEvent,
    PrivacyLedger,
    amplified_epsilon,
    privacy_statement,
)

DELTA = 1e-5
NM = 1.07 / math.sqrt(32)
KW = dict(delta=DELTA, clients_per_step=1, num_clients=4, noise_multiplier=1.07, batch_size=32)


def _ledgers(counts: dict[int, int]) -> dict[int, PrivacyLedger]:
    return {
        cid: PrivacyLedger([PrivacyEvent(noise_multiplier=NM, sample_rate=1.0, count=n)] if n else [])
        for cid, n in counts.items()
    }


def test_statement_names_rules_delta_and_worst_client() -> None:
    ledgers = _ledgers({0: 2, 1: 5, 2: 3, 3: 0})
    text = privacy_statement(ledgers, steps=10, **KW)
    worst = ledgers[1].epsilon(delta=DELTA)
    assert "δ = 1e-05" in text and "RDP" in text and "PRV" in text
    assert ACCOUNTING_RULE_PER_CLIENT in text and ACCOUNTING_RULE_AMPLIFIED in text
    assert "client (1, 5 queries)" in text and f"{worst:.3g}" in text
    amplified = amplified_epsilon(noise_multiplier=NM, sample_rate=0.25, steps=10, delta=DELTA)
    assert f"{amplified:.3g}" in text and "3 of 4 clients" in text
    assert "weak" in text  # ε in the hundreds must be called what it is


def test_statement_without_queries() -> None:
    text = privacy_statement(_ledgers({0: 0, 1: 0}), steps=0, **KW)
    assert "no client has answered a query, so ε = 0" in text and "weak" not in text


def test_statement_is_conservative_on_ledger_config_mismatch() -> None:
    """Ledgers recording a smaller multiplier, or more queries than steps: the worse one is used."""
    ledgers = {0: PrivacyLedger([PrivacyEvent(noise_multiplier=0.1, sample_rate=1.0, count=4)])}
    text = privacy_statement(ledgers, steps=2, **KW)
    assert "below the configured" in text and "after 4 generator steps" in text


def test_statement_rejects_bad_sampling() -> None:
    with pytest.raises(ValueError):
        privacy_statement({}, steps=1, **{**KW, "clients_per_step": 5})
