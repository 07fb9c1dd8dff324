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

A ledger rolled back or deleted would hand the node a fresh budget (audit 4: ε 41.65 and 55.62
against a limit of 40). So each version of the ledger carries a link of a hash chain (its content
hashed with the previous version's link), and a counter file beside it (``node-ledger-<client>.count``:
the releases and the latest link, written after the ledger) records how far it got. A ledger whose
content does not hash to its link, behind its counter, with another link at the same count, or
missing while the counter exists, is refused; the node's shell also checks it against
the client state on the same disk (``client/node.py``). What no local record can catch is every
file rolled back together (that needs a monotonic counter outside the disk); docs/privacy.md says so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .events import PrivacyEvent
from .ledger import PrivacyLedger

NODE_LEDGER_FORMAT = "fedgan.node_ledger/2"  # 2: the hash chain (format 1 files read as chain "")
NODE_LEDGER_FORMATS = (NODE_LEDGER_FORMAT, "fedgan.node_ledger/1")
COUNTER_FORMAT = "fedgan.node_ledger_counter/1"
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
    chain: str = ""  # this version's link: its content hashed with the previous version's link
    previous: str = ""  # the previous version's link ("": the first)

    @property
    def releases(self) -> int:
        return self.ledger.queries

    def link(self) -> str:
        """SHA-256 of the previous link and this version's content (ledger and counts)."""
        body = json.dumps([self.client_id, self.ledger.state_dict(), self.by_method], sort_keys=True)
        return hashlib.sha256(f"{self.previous}|{body}".encode()).hexdigest()

    def seal(self) -> None:
        """The next version: its link chained to the one this version had."""
        self.previous, self.chain = self.chain, ""
        self.chain = self.link()

    def intact(self) -> bool:
        """Whether the content is what its link was made from (a format-1 file has no link)."""
        return not self.chain or self.chain == self.link()

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": NODE_LEDGER_FORMAT,
                "client_id": self.client_id,
                "ledger": self.ledger.state_dict(),
                "by_method": self.by_method,
                "chain": self.chain,
                "previous": self.previous,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, client_id: int) -> NodeBook:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") not in NODE_LEDGER_FORMATS:
            raise ValueError(f"not a node ledger (expected format {NODE_LEDGER_FORMAT!r})")
        if int(data["client_id"]) != client_id:
            raise ValueError(f"it holds client {data['client_id']}, not {client_id}")
        by_method = {str(k): int(v) for k, v in dict(data.get("by_method", {})).items()}
        ledger = PrivacyLedger.from_state_dict(data["ledger"])
        return cls(client_id, ledger, by_method, str(data.get("chain", "")), str(data.get("previous", "")))


@dataclass(frozen=True)
class Counter:
    """What the counter file beside a node ledger records: how many releases it held at its last
    write, and its chain's head then."""

    releases: int = 0
    chain: str = ""


def counter_path(root: str | Path, client_id: int) -> Path:
    return Path(root) / f"node-ledger-{client_id:05d}.count"


def read_counter(root: str | Path, client_id: int) -> Counter | None:
    """The counter (None: the node never charged this client); NodeLedgerError when unreadable."""
    path = counter_path(root, client_id)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != COUNTER_FORMAT or int(data["client_id"]) != client_id:
            raise ValueError(f"not the counter of client {client_id} (format {COUNTER_FORMAT!r})")
        return Counter(int(data["releases"]), str(data["chain"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise NodeLedgerError(
            f"the release counter {path} beside the node ledger is unreadable ({type(err).__name__}: "
            f"{str(err)[:160]}); the node releases nothing until an operator repairs it"
        ) from err


def rollback_problem(book: NodeBook | None, counter: Counter | None, path: Path) -> str:
    """Why the node ledger at ``path`` (``book``; None: the file is missing) is not the latest the
    node wrote ("" when it is). A ledger ahead of its counter is a write cut short between the two
    files: it holds more releases, never fewer, so it stands."""
    if book is not None and not book.intact():
        return f"node ledger {path} does not hash to its own chain link (its content was edited)"
    if counter is None or counter.releases == 0:
        return ""
    if book is None:
        return f"node ledger {path} is missing, but its counter records {counter.releases} releases"
    if book.releases < counter.releases:
        return f"node ledger {path} holds {book.releases} releases, its counter {counter.releases}"
    if book.releases == counter.releases and book.chain != counter.chain:
        return f"node ledger {path} holds another history than its counter's chain ({counter.releases} releases)"
    return ""


ROLLED_BACK = (
    ": it was rolled back, replaced or deleted, which would give this node a fresh budget. The node releases "
    "nothing until an operator restores the latest ledger (an older copy is refused the same way)"
)


def node_ledger_path(root: str | Path, client_id: int) -> Path:
    return Path(root) / f"node-ledger-{client_id:05d}.json"


def read_node_book(root: str | Path, client_id: int) -> NodeBook:
    """The client's node-level record (empty when it never released), checked against the counter
    beside it; NodeLedgerError when unreadable, rolled back or deleted."""
    path = node_ledger_path(root, client_id)
    counter = read_counter(root, client_id)
    try:
        book: NodeBook | None = NodeBook.from_json(path.read_text(), client_id)
    except FileNotFoundError:
        book = None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise NodeLedgerError(
            f"node ledger {path} is unreadable ({type(err).__name__}: {str(err)[:160]}); it holds every "
            "release of this node's data, and the node releases nothing until an operator repairs it"
        ) from err
    problem = rollback_problem(book, counter, path)
    if problem:
        raise NodeLedgerError(problem + ROLLED_BACK)
    return book if book is not None else NodeBook(client_id)


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
            book.seal()
            _write(node_ledger_path(root, client_id), book.to_json())  # the ledger first: a crash leaves it ahead
            counter = {"format": COUNTER_FORMAT, "client_id": client_id, "releases": book.releases, "chain": book.chain}
            _write(counter_path(root, client_id), json.dumps(counter))


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
