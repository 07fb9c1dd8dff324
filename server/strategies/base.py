"""The strategy interface: the one round loop (``server/loop.py``) calls these hooks, nothing else.

A strategy decides whom to ask and what to send (``configure_step``), and what to do with the
replies (``aggregate_step``). Transport, byte counting, logging, checkpoints and reports are the
loop's. Baseline strategies (DPGAN, Fed-Avg GAN) plug in by implementing the same hooks.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from flwr.app import RecordDict
from torch import nn

from common.codec import PayloadError
from common.privacy import PrivacyEvent, PrivacyLedger
from protos import wire


@dataclass
class Outgoing:
    node_id: int
    message_type: str
    content: RecordDict


@dataclass
class Incoming:
    """A reply (or its absence): ``content`` is None when the node failed or timed out."""

    node_id: int
    content: RecordDict | None
    error: str = ""


@dataclass
class StepOutcome:
    """What one round produced: whether the generator moved, metrics, and nodes to stop asking."""

    took_step: bool
    metrics: dict[str, float] = field(default_factory=dict)
    exhausted_nodes: list[int] = field(default_factory=list)
    failed_nodes: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class PriorReleases:
    """Releases made before this run that its generator depends on: the debugging task's selection
    query (every client's noisy accuracy decided who takes part). The strategy starts its record of
    each client and its own server-side ledger from these, so every report of the run covers them,
    also for clients outside the run's subset."""

    clients: dict[int, PrivacyLedger] = field(default_factory=dict)
    server: list[PrivacyEvent] = field(default_factory=list)
    description: str = ""


MAX_LEDGER_CHARS = 1_000_000  # a ledger merges repeated events: even 10^5 distinct ones fit


@dataclass
class CarriedLedger:
    """The ``ledger`` field of any reply that carries one (hello, ledger, a DPGAN round)."""

    ledger: str | None = None


def ledger_from_reply(reply: Incoming) -> tuple[PrivacyLedger | None, str]:
    """The client ledger a reply carries, or None and why not ("" when it carries none).

    A ledger is the node's own claim: any reply that does not parse into valid events (garbled JSON,
    a wrong structure, an overflowing count) is unreadable, never fatal."""
    if reply.content is None:
        return None, ""
    try:
        text = wire.decode(CarriedLedger, reply.content).ledger
        if text is None:
            return None, ""
        if len(text) > MAX_LEDGER_CHARS:
            return None, f"its ledger is {len(text):,} characters (at most {MAX_LEDGER_CHARS:,} are read)"
        return PrivacyLedger.from_state_dict(json.loads(text)), ""
    except (PayloadError, ValueError, KeyError, TypeError, OverflowError, AttributeError, RecursionError) as err:
        return None, f"its ledger is unreadable ({type(err).__name__}: {str(err)[:120]})"


class Strategy(ABC):
    node_client: dict[int, int]

    def bind_nodes(self, node_client: dict[int, int]) -> None:
        """Learn which client (partition) each node holds, from the run's hello exchange."""
        self.node_client = dict(node_client)

    @abstractmethod
    def select_nodes(self, available: list[int]) -> list[int]:
        """Sample the nodes to query this step from ``available`` (server randomness only)."""

    @abstractmethod
    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        """Build one message per selected node."""

    @abstractmethod
    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        """Consume the replies; update the server's model if they allow it."""

    @abstractmethod
    def released_generator(self) -> nn.Module:
        """The model that is released (and evaluated): the generator's EMA copy."""

    @abstractmethod
    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        """Per-client and global privacy figures for metrics and summary.json.

        Keys: ``clients``, ``epsilon_max``, ``accounting``, ``epsilon_amplified``, ``statement``
        (the plain-language paragraph of privacy.json; needed when ``final``), optionally
        ``summary_extra`` (strategy-specific summary.json keys).
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        """Messages asking clients for their own ledgers at the end of a run (default: none)."""
        return []

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        """Take the ledgers the clients sent (at the hello: ``final`` False; at the end of the run);
        returns notes for the run (default: none)."""
        return []
