"""A client's privacy ledger: the run-length history of the queries it actually answered.

Mirrors Opacus' accountant (history of ``(noise_multiplier, sample_rate, count)``, ``state_dict``),
with ε cached per ledger state because the server asks for every client's ε at each logging
interval. ε of n identical queries costs one RDP evaluation (the curve of one run is cached in
``analysis`` and scaled by the count).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .analysis import check_delta, prv_epsilon_with_reason, rdp_epsilon
from .sanitizer import PrivacyEvent

ACCOUNTANTS = ("rdp", "prv")
LEDGER_FORMAT = "fedgan.privacy_ledger/1"


def _merged(history: list[PrivacyEvent], event: PrivacyEvent) -> list[PrivacyEvent]:
    """``history`` with ``event`` appended, merged into the last run when it is the same mechanism."""
    if history and history[-1].same_mechanism(event):
        last = history[-1]
        return history[:-1] + [
            PrivacyEvent(
                noise_multiplier=last.noise_multiplier,
                sample_rate=last.sample_rate,
                count=last.count + event.count,
            )
        ]
    return history + [event]


def _rdp(history: Iterable[PrivacyEvent], delta: float) -> tuple[float, float]:
    return rdp_epsilon([e.astuple() for e in history], delta=delta)


class PrivacyLedger:
    """Run-length history of answered queries, with cached ε (RDP headline, PRV beside it)."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._history: list[PrivacyEvent] = []
        self._cache: dict[tuple[str, float], Any] = {}
        for event in events:
            self.record(event)

    # --- recording ----------------------------------------------------------------------------
    def record(self, event: PrivacyEvent) -> None:
        """Charge one answered query (or ``event.count`` identical ones)."""
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        self._history = _merged(self._history, event)
        self._cache.clear()

    @property
    def history(self) -> tuple[PrivacyEvent, ...]:
        return tuple(self._history)

    @property
    def queries(self) -> int:
        """Total number of answered queries."""
        return sum(e.count for e in self._history)

    # --- epsilon ------------------------------------------------------------------------------
    def rdp_epsilon(self, *, delta: float) -> tuple[float, float]:
        """(ε, best order) of everything recorded, RDP accountant, cached until the next record."""
        key = ("rdp", delta)
        if key not in self._cache:
            self._cache[key] = _rdp(self._history, delta)
        return self._cache[key]

    def prv_epsilon(self, *, delta: float) -> tuple[float | None, str | None]:
        """(ε, None) from PRV, or (None, reason) where PRV cannot give a sound number."""
        check_delta(delta)
        key = ("prv", delta)
        if key not in self._cache:
            self._cache[key] = prv_epsilon_with_reason([e.astuple() for e in self._history], delta=delta)
        return self._cache[key]

    def epsilon(self, *, delta: float, accountant: str = "rdp") -> float | None:
        """ε of the ledger; ``accountant="prv"`` may give None (see ``prv_epsilon``)."""
        if accountant == "rdp":
            return self.rdp_epsilon(delta=delta)[0]
        if accountant == "prv":
            return self.prv_epsilon(delta=delta)[0]
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")

    def epsilon_both(self, *, delta: float) -> dict[str, Any]:
        """JSON-ready ``{"epsilon", "epsilon_prv", "epsilon_prv_reason", "order", "queries"}``.

        ``order`` and ``epsilon_prv`` are None where undefined (no query, no noise, PRV failed).
        """
        eps, order = self.rdp_epsilon(delta=delta)
        eps_prv, reason = self.prv_epsilon(delta=delta)
        return {
            "epsilon": eps,
            "epsilon_prv": eps_prv,
            "epsilon_prv_reason": reason,
            "order": None if math.isnan(order) else order,
            "queries": self.queries,
        }

    def would_exceed(self, *, budget: float, delta: float, next_event: PrivacyEvent) -> bool:
        """True when answering ``next_event`` would push the RDP ε above ``budget`` (0: no budget).

        Computed on exactly the history ``record`` would produce, so a client that answers only
        when this is False never ends with ε > budget.
        """
        if budget < 0 or math.isnan(budget):
            raise ValueError(f"budget must be >= 0, got {budget}")
        if budget == 0:
            return False
        eps, _ = _rdp(_merged(self._history, next_event), delta)
        return eps > budget

    # --- persistence --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state: ``{"format": ..., "history": [event dicts]}``."""
        return {"format": LEDGER_FORMAT, "history": [e.to_dict() for e in self._history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the history with ``state`` (validated; an unknown format is an error)."""
        if not isinstance(state, Mapping) or state.get("format") != LEDGER_FORMAT:
            raise ValueError(f"not a privacy ledger state (expected format {LEDGER_FORMAT!r})")
        history: list[PrivacyEvent] = []
        for item in state["history"]:
            history = _merged(history, PrivacyEvent.from_dict(item))
        self._history = history
        self._cache.clear()

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PrivacyLedger:
        ledger = cls()
        ledger.load_state_dict(state)
        return ledger

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self._history == other._history

    def __repr__(self) -> str:
        runs = ", ".join(
            f"{e.count}×(nm={e.noise_multiplier:.4g}, q={e.sample_rate:.4g})" for e in self._history
        )
        return f"PrivacyLedger({runs})"
