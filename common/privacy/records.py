"""What the server knows of each client's privacy spending: its own record and the client's ledger.

Two records exist for every client and reports keep the larger (``PrivacyLedger.exceeds``):

- the server's record, charged when a message that may produce a release is *sent* (a reply lost to
  a timeout or a crash may still have been answered, and charged, on the client); a method's
  server side withdraws nothing but what an explicit refusal proves was not released;
- the client's own ledger, sent with its hello (so a resumed run's live ε is current) and fetched
  at the end of the run (also from nodes that failed, best effort).

Neither may silently replace the other: a client ledger can be smaller after its state file was
lost, a server record smaller after a late answer. A client ledger that goes backwards (it no
longer extends the one the client sent before: its state was lost or replaced) never erases what
it had reported: those releases are kept as the client's *earlier* ledger, composed with whatever
it sends from then on, and a note says so (the released generator depends on all of them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .events import PrivacyEvent
from .ledger import PrivacyLedger

# The ledger of every client without releases: read-only, shared so its (zero) ε is computed once,
# not once per client per metrics line (3,400 clients in a FEMNIST-sized federation).
NO_RELEASES = PrivacyLedger()
MAX_LEDGER_CHARS = 1_000_000  # a ledger merges repeated events: even 10^5 distinct ones fit
UNREADABLE = (ValueError, KeyError, TypeError, OverflowError, AttributeError, RecursionError)


def unreadable(err: Exception) -> str:
    """Why a ledger a node sent cannot be used, in one line."""
    return f"its ledger is unreadable ({type(err).__name__}: {str(err)[:120]})"


def parse_ledger(text: str | None) -> tuple[PrivacyLedger | None, str]:
    """The ledger a node sent as JSON, or None and why not ("" when it sent none).

    A ledger is the node's own claim: text that does not parse into valid events (garbled JSON, a
    wrong structure, an overflowing count) is unreadable, never fatal."""
    if text is None:
        return None, ""
    if len(text) > MAX_LEDGER_CHARS:
        return None, f"its ledger is {len(text):,} characters (at most {MAX_LEDGER_CHARS:,} are read)"
    try:
        return PrivacyLedger.from_state_dict(json.loads(text)), ""
    except UNREADABLE as err:
        return None, unreadable(err)


@dataclass
class LedgerClaim:
    """A ledger a node sent (its hello, a ledger query, a DPGAN round): the JSON text, None when the
    reply carried none, and ``problem`` when the reply could not be read at all."""

    node: int
    text: str | None = None
    problem: str = ""
    own_text: str | None = None  # through secure sums: its record of its own noise shares

    def shares(self) -> LedgerClaim:
        """The claim of its own-share ledger, as a claim of its own (read by the deviating figure)."""
        return LedgerClaim(self.node, self.own_text, self.problem)


class ClientRecords:
    def __init__(self, delta: float, prior: dict[int, PrivacyLedger] | None = None) -> None:
        self.delta = delta
        self.charged: dict[int, PrivacyLedger] = {c: led.copy() for c, led in (prior or {}).items()}
        self.own: dict[int, PrivacyLedger] = {}
        self.earlier: dict[int, PrivacyLedger] = {}  # releases of ledgers the client has since lost
        self.version = 0  # changes with every record: what was computed from them is still valid while it holds

    def charge(self, client_id: int, event: PrivacyEvent) -> None:
        self.charged.setdefault(client_id, PrivacyLedger()).record(event)
        self.version += 1

    def absorb(self, node_client: dict[int, int], claims: list[LedgerClaim], *, final: bool) -> list[str]:
        """Take the ledgers the nodes sent ; the client is
        the one the node holds (learned at the hello), never what a payload claims. At the end, note
        every disagreement."""
        notes = []
        for claim in claims:
            cid = node_client.get(claim.node)
            own, problem = parse_ledger(claim.text) if not claim.problem else (None, claim.problem)
            if problem:
                notes.append(f"node {claim.node} (client {cid}): {problem}; the server's record of it is reported")
            if cid is None or own is None:
                continue
            notes += self._take_own(cid, own)
            charged = self.charged.get(cid, NO_RELEASES)
            if final and charged.queries != own.queries:
                notes.append(
                    f"client {cid}: its ledger holds {own.queries} releases, the server's record "
                    f"{charged.queries} (the larger is reported)"
                )
        return notes

    def _take_own(self, cid: int, own: PrivacyLedger) -> list[str]:
        """Keep the client's latest ledger; one that went backwards moves the previous one (with
        what the client had lost before) into ``earlier``, and says so."""
        previous = self.own.get(cid)
        self.own[cid] = own
        self.version += 1
        if previous is None or own.extends(previous):
            return []
        self.earlier[cid] = self.earlier.get(cid, NO_RELEASES).combined(previous)
        return [
            f"client {cid}: its ledger went backwards ({previous.queries} releases before, {own.queries} now: "
            "its state was lost or replaced); the releases it had reported stay counted, composed with its new ones"
        ]

    def own_total(self, client_id: int) -> PrivacyLedger:
        """Everything the client's ledgers have shown: the lost ones, then its latest."""
        own = self.own.get(client_id, NO_RELEASES)
        earlier = self.earlier.get(client_id)
        return own if earlier is None else earlier.combined(own)

    def settle(self, client_id: int) -> None:
        """The client's reply carried its whole ledger, up to and including the message just
        answered (or refused): the server's record of it becomes that ledger, composed with any
        the client has lost before, and never smaller than the record it replaces by more than
        the planned charges it settles (``own_total`` keeps every release ever reported)."""
        if client_id in self.own:
            self.charged[client_id] = self.own_total(client_id).copy()  # charged later, never the own
            self.version += 1

    def releases(self, client_id: int) -> int:
        """How many releases the client has made: the larger of the server's record and its ledgers'."""
        return max(self.charged.get(client_id, NO_RELEASES).queries, self.own_total(client_id).queries)

    def ledger_of(self, client_id: int) -> PrivacyLedger:
        """The larger of everything the client's ledgers showed and the server's record of it."""
        own, charged = self.own_total(client_id), self.charged.get(client_id, NO_RELEASES)
        return charged if charged.exceeds(own, delta=self.delta) else own

    def clients(self) -> list[int]:
        """The clients with any record (charged, or a ledger of their own), ascending: every other
        client has released nothing."""
        return sorted(self.charged.keys() | self.own.keys() | self.earlier.keys())

    def ledgers(self, client_ids: range | list[int]) -> dict[int, PrivacyLedger]:
        return {cid: self.ledger_of(cid) for cid in client_ids}

    def state_dict(self) -> dict[str, Any]:
        return {
            "charged": {c: led.state_dict() for c, led in self.charged.items()},
            "own": {c: led.state_dict() for c, led in self.own.items()},
            "earlier": {c: led.state_dict() for c, led in self.earlier.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.charged = {int(c): PrivacyLedger.from_state_dict(s) for c, s in state.get("charged", {}).items()}
        self.own = {int(c): PrivacyLedger.from_state_dict(s) for c, s in state.get("own", {}).items()}
        self.earlier = {int(c): PrivacyLedger.from_state_dict(s) for c, s in state.get("earlier", {}).items()}
        self.version += 1
