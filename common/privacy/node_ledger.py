"""A node's own privacy ledger: every release its data made, across runs and methods, in one unit.

Why: a node's budget (its policy's ``max-epsilon``) is the node's, not a run's or a state file's.
Kept with a run's client state, it restarted at zero whenever a server named a new directory, and
DPGAN's curator kept another, example-level one. So each client a node holds has one file,
``node-ledger-<client>.json``, in the directory the node's own configuration fixes (a server's
hello never chooses it), and every release of every method is charged to it before its reply
leaves the node, in the node's unit (the client's whole data set), with the method's own rule:

- GS-WGAN answers, DP-MERF summaries, the debugging task's selection: per-client Gaussian
  releases, charged as the methods record them;
- Fed-Avg GAN's raw deltas: releases without noise (void: ε unbounded);
- DPGAN's DP-SGD steps on the pooled data: each pooled client is charged its group's cost,
  ``pooled_event`` (conservative: no amplification, its whole partition replaced).

The file also counts releases per method (DP-MERF answers once per node unless a budget governs).
Writes are atomic and serialized by a lock file, so a node's messages in several processes never
lose a charge. A file that cannot be read makes the node refuse every release (fail closed).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .events import PrivacyEvent
from .ledger import PrivacyLedger

NODE_LEDGER_FORMAT = "fedgan.node_ledger/1"
# Where a simulated node keeps its state and ledger when its node config names no state-dir: set
# by the simulation's operator (``fedgan simulate``), never by a server's message.
NODE_STATE_ENV = "FEDGAN_NODE_STATE"
LOCK_NAME = ".node-ledger.lock"


class NodeLedgerError(RuntimeError):
    """A node ledger cannot be read or written; the message names the file."""


@dataclass
class NodeBook:
    """One client's node-level record: its ledger and how many releases each method made."""

    client_id: int
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)
    by_method: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": NODE_LEDGER_FORMAT,
                "client_id": self.client_id,
                "ledger": self.ledger.state_dict(),
                "by_method": self.by_method,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, client_id: int) -> NodeBook:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != NODE_LEDGER_FORMAT:
            raise ValueError(f"not a node ledger (expected format {NODE_LEDGER_FORMAT!r})")
        if int(data["client_id"]) != client_id:
            raise ValueError(f"it holds client {data['client_id']}, not {client_id}")
        by_method = {str(k): int(v) for k, v in dict(data.get("by_method", {})).items()}
        return cls(client_id, PrivacyLedger.from_state_dict(data["ledger"]), by_method)


def node_ledger_path(root: str | Path, client_id: int) -> Path:
    return Path(root) / f"node-ledger-{client_id:05d}.json"


def read_node_book(root: str | Path, client_id: int) -> NodeBook:
    """The client's node-level record (empty when it never released), or NodeLedgerError."""
    path = node_ledger_path(root, client_id)
    try:
        return NodeBook.from_json(path.read_text(), client_id)
    except FileNotFoundError:
        return NodeBook(client_id)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise NodeLedgerError(
            f"node ledger {path} is unreadable ({type(err).__name__}: {str(err)[:160]}); it holds every "
            "release of this node's data: restore it from a backup; until then the node releases nothing"
        ) from err


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def charge_node(root: str | Path, charges: dict[int, Iterable[PrivacyEvent]], *, method: str) -> None:
    """Append each client's ``events`` to its node ledger (one lock for all of them), counting them
    as ``method``'s releases. Written before the release leaves the node: a crash in between
    over-counts, never under-counts."""
    root = Path(root)
    with _locked(root):
        for client_id, events in charges.items():
            events = list(events)
            if not events:
                continue
            book = read_node_book(root, client_id)
            for event in events:
                book.ledger.record(event)
            book.by_method[method] = book.by_method.get(method, 0) + sum(e.count for e in events)
            _write(node_ledger_path(root, client_id), book.to_json())


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise NodeLedgerError(
            f"node ledger {path} cannot be written ({err.strerror or err}); nothing was released"
        ) from err


def pooled_event(event: PrivacyEvent, partition_size: int) -> PrivacyEvent:
    """DPGAN's DP-SGD steps as one pooled client's release, in the node's unit.

    A step adds N(0, (σC)²) to the sum of per-example gradients clipped to C. Replacing the client's
    whole partition of n examples moves that sum by at most 2nC, so each step is, for that client,
    a Gaussian mechanism with noise multiplier σ/(2n). Charged without amplification (the sampling
    that DP-SGD's example-level bound relies on says nothing about a group of n): conservative."""
    return PrivacyEvent(
        noise_multiplier=event.noise_multiplier / (2 * max(partition_size, 1)),
        sample_rate=1.0,
        count=event.count,
        void=event.void,
    )
