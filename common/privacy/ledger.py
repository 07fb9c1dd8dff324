"""A privacy ledger: the run-length history of the releases that actually happened.

Mirrors Opacus' accountant (a history of events, ``state_dict``), with ε cached per ledger state
because the server asks for every client's ε at each logging interval. ε of n identical releases
costs one RDP evaluation (the curve of one run is cached in ``analysis`` and scaled by the count).

Every ε the system prints comes from a ledger (``headline``, ``rdp_epsilon``, ``prv_epsilon``):
a client's own ledger for per-client figures, a server-side ledger for the figures that rest on
the server's sampling. A ledger holding a void event (``events.py``) has an unbounded ε, reported
as null with the reason; ``nominal_rdp_epsilon`` ignores the void marks and serves only the budget
check, so that a debugging run still stops where a private one would.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .analysis import ORDERS, check_delta, epsilon_from_rdp, prv_epsilon_with_reason, unit_rdp
from .events import PrivacyEvent
from .skellam import DELTA_PER_RELEASE, skellam_rdp

ACCOUNTANTS = ("rdp", "prv")
LEDGER_FORMAT = "fedgan.privacy_ledger/3"
# format 1: events without sampling/void fields; format 2: Gaussian events only (no Skellam fields)
_FORMATS = (LEDGER_FORMAT, "fedgan.privacy_ledger/2", "fedgan.privacy_ledger/1")


def _merged(history: list[PrivacyEvent], event: PrivacyEvent) -> list[PrivacyEvent]:
    """``history`` with ``event`` appended, merged into the last run when it is the same mechanism."""
    if history and history[-1].same_mechanism(event):
        return history[:-1] + [event.times(history[-1].count + event.count)]
    return history + [event]


def _check_adjacency(history: list[PrivacyEvent]) -> None:
    """Poisson bounds are for add/remove adjacency, without-replacement ones for replace-one: a
    ledger composing both would mix two notions of neighbouring data sets."""
    kinds = {e.sampling for e in history}
    if {"poisson", "wor"} <= kinds:
        raise ValueError(
            "a ledger cannot compose Poisson-sampled (add/remove) and without-replacement (replace-one) events"
        )


def event_rdp(e: PrivacyEvent) -> np.ndarray:
    """The RDP curve of one run of ``e``'s mechanism at ``ORDERS``."""
    if e.noise == "skellam":
        return skellam_rdp(ORDERS, mu=e.skellam_mu, l1=e.l1, l2=e.l2)
    return unit_rdp(e.noise_multiplier, e.sample_rate, e.sampling, ORDERS)


def _curve(history: Iterable[PrivacyEvent]) -> np.ndarray:
    total = np.zeros(len(ORDERS))
    for e in history:
        total = total + e.count * event_rdp(e)
    return total


@functools.lru_cache(maxsize=4096)
def history_epsilon(history: tuple[PrivacyEvent, ...], delta: float) -> tuple[float, float]:
    """(ε, best order) of a history, RDP, void marks ignored; shared by every ledger holding the same
    history. A federation's clients mostly hold identical ones (DP-MERF: one release each): at
    K = 10^5 the first report computed the same ε 10^5 times, 57 s. Each Skellam release first spends
    ``DELTA_PER_RELEASE`` of δ (its node's range check, ``skellam.py``)."""
    check_delta(delta)
    spent = DELTA_PER_RELEASE * sum(e.count for e in history if e.noise == "skellam")
    if spent >= delta:
        return math.inf, math.nan
    return epsilon_from_rdp(_curve(history), delta=delta - spent)


class PrivacyLedger:
    """Run-length history of releases, with cached ε (RDP headline, PRV beside it)."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._history: list[PrivacyEvent] = []
        self._cache: dict[tuple[str, float], Any] = {}
        for event in events:
            self.record(event)

    # --- recording ----------------------------------------------------------------------------
    def record(self, event: PrivacyEvent) -> None:
        """Charge one release (or ``event.count`` identical ones)."""
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        history = _merged(self._history, event)
        _check_adjacency(history)
        self._history = history
        self._cache.clear()

    def copy(self) -> PrivacyLedger:
        return PrivacyLedger(self._history)

    @property
    def history(self) -> tuple[PrivacyEvent, ...]:
        return tuple(self._history)

    @property
    def queries(self) -> int:
        """Total number of releases recorded."""
        return sum(e.count for e in self._history)

    @property
    def void_reasons(self) -> tuple[str, ...]:
        """Why this ledger's ε is unbounded although noise was added (distinct, in order)."""
        return self._cached(("void", 0.0), lambda: tuple(dict.fromkeys(e.void for e in self._history if e.void)))

    # --- epsilon ------------------------------------------------------------------------------
    def _cached(self, key: tuple[str, float], compute) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def nominal_rdp_epsilon(self, *, delta: float) -> tuple[float, float]:
        """(ε, best order) of the mechanisms as if every release had been private (void marks
        ignored). For the budget check only: never report it as a guarantee."""
        return self._cached(("nominal", delta), lambda: history_epsilon(tuple(self._history), delta))

    def rdp_epsilon(self, *, delta: float) -> tuple[float, float]:
        """(ε, best order) of everything recorded, RDP accountant; (inf, nan) when any release was void."""
        if self.void_reasons:
            check_delta(delta)
            return math.inf, math.nan
        return self.nominal_rdp_epsilon(delta=delta)

    def prv_epsilon(self, *, delta: float) -> tuple[float | None, str | None]:
        """(ε, None) from PRV, or (None, reason) where PRV cannot give a sound number."""
        check_delta(delta)
        return self._cached(("prv", delta), lambda: self._prv(delta))

    def _prv(self, delta: float) -> tuple[float | None, str | None]:
        if self.void_reasons:
            return math.inf, None
        if any(e.sampling == "wor" for e in self._history):
            return None, "PRV has no bound for sampling without replacement; use the RDP value"
        if any(e.noise == "skellam" for e in self._history):
            return None, "PRV has no Skellam mechanism; use the RDP value"
        return prv_epsilon_with_reason([e.astuple() for e in self._history], delta=delta)

    def epsilon(self, *, delta: float, accountant: str = "rdp") -> float | None:
        """ε of the ledger; ``accountant="prv"`` may give None (see ``prv_epsilon``)."""
        if accountant == "rdp":
            return self.rdp_epsilon(delta=delta)[0]
        if accountant == "prv":
            return self.prv_epsilon(delta=delta)[0]
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")

    def unbounded_reason(self) -> str | None:
        """Why ε is unbounded (void releases, or a release without noise), else None."""
        if self.void_reasons:
            return "unbounded: NOT PRIVATE: " + "; ".join(self.void_reasons)
        if any(e.noise_multiplier == 0 for e in self._history):
            return "unbounded: a release carried no noise (noise multiplier 0)"
        return None

    def headline(self, *, delta: float, accountant: str = "rdp") -> tuple[float, str | None]:
        """(ε, reason) for reports: the chosen accountant's ε, or RDP where PRV cannot give one
        (the reason says so); inf with the reason when ε is unbounded."""
        reason = self.unbounded_reason()
        if reason is not None:
            return math.inf, reason
        if accountant == "prv":
            eps, why = self.prv_epsilon(delta=delta)
            if eps is not None:
                return eps, None
            return self.rdp_epsilon(delta=delta)[0], f"RDP shown: PRV not available ({why})"
        return self.epsilon(delta=delta, accountant=accountant), None

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
        """True when recording ``next_event`` would push the RDP ε above ``budget`` (0: no budget).

        Computed on exactly the history ``record`` would produce, so a client that answers only
        when this is False never ends with ε > budget. Void marks are ignored (nominal ε): a
        debugging run, already unbounded, still stops where a private run would.
        """
        if budget < 0 or math.isnan(budget):
            raise ValueError(f"budget must be >= 0, got {budget}")
        if budget == 0 or math.isinf(budget):
            return False
        eps, _ = epsilon_from_rdp(_curve(_merged(self._history, next_event)), delta=delta)
        return eps > budget

    def since(self, earlier: PrivacyLedger) -> list[PrivacyEvent]:
        """The releases recorded after ``earlier`` (an earlier state of this ledger), in order;
        ValueError when ``earlier`` is not one (``extends`` is False)."""
        if not self.extends(earlier):
            raise ValueError(f"{earlier!r} is not an earlier state of {self!r}")
        head = list(earlier.history)
        if not head:
            return list(self._history)
        k = len(head) - 1  # the earlier last run may since have grown in count
        rest = list(self._history[k:])
        grown = rest[0].count - head[-1].count
        return ([rest[0].times(grown)] if grown else []) + rest[1:]

    def combined(self, other: PrivacyLedger) -> PrivacyLedger:
        """This ledger's releases followed by ``other``'s: the composition of both."""
        out = self.copy()
        for event in other.history:
            out.record(event)
        return out

    # --- comparison ---------------------------------------------------------------------------
    def extends(self, earlier: PrivacyLedger) -> bool:
        """True when ``earlier`` is an earlier state of this ledger: the same releases, in the same
        order, of which this one may hold more (a ledger that only ever grew)."""
        head, mine = earlier.history, self._history
        if not head:
            return True
        if len(head) > len(mine) or list(head[:-1]) != mine[: len(head) - 1]:
            return False
        last, here = head[-1], mine[len(head) - 1]
        return here.same_mechanism(last) and here.count >= last.count

    def exceeds(self, other: PrivacyLedger, *, delta: float) -> bool:
        """True when this ledger accounts for strictly more than ``other`` (larger ε; equal ε: more
        releases). Where two records of the same client disagree, reports keep the larger."""
        mine, theirs = self.rdp_epsilon(delta=delta)[0], other.rdp_epsilon(delta=delta)[0]
        if mine != theirs:
            return mine > theirs
        return self.queries > other.queries

    # --- persistence --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state: ``{"format": ..., "history": [event dicts]}``."""
        return {"format": LEDGER_FORMAT, "history": [e.to_dict() for e in self._history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the history with ``state`` (validated; an unknown format is an error)."""
        if not isinstance(state, Mapping) or state.get("format") not in _FORMATS:
            raise ValueError(f"not a privacy ledger state (expected format {LEDGER_FORMAT!r})")
        history: list[PrivacyEvent] = []
        for item in state["history"]:
            history = _merged(history, PrivacyEvent.from_dict(item))
        _check_adjacency(history)
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
            f"{e.count}×(nm={e.noise_multiplier:.4g}, q={e.sample_rate:.4g}, {e.sampling}"
            + (f", VOID {e.void}" if e.void else "")
            + ")"
            for e in self._history
        )
        return f"PrivacyLedger({runs})"
