"""Every message between the server and a client: its type name and its payload.

Payloads are plain dataclasses (framework-free: scalars, numpy arrays, torch state dicts, statistics)
so that any transport can carry them; ``protos/wire.py`` turns them into Flower records and back,
with one generic codec. A payload that needs context to be checked (the step the server is on, the
batch size it asked for, the client's configuration) defines ``decoded(**expect)``, which returns it
validated and in plain arrays; whoever holds that context calls it (``wire.decode(cls, content,
**expect)``), so what reaches a model has been validated at the boundary.

Shared messages are defined here (the secure sum's four rounds in ``common/secagg/messages.py``);
each method's own messages live in its folder (``common/methods/<name>/messages.py``), and the
registry's ``catalogue`` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.secagg.messages import SECAGG

StateDict = dict[str, torch.Tensor]  # travels as its own ArrayRecord (Flower's torch serialization)
Stats = dict[str, float]  # travels as its own ConfigRecord, left out when empty

HELLO = "query.hello"
LEDGER = "query.ledger"
DATAPLANE = "query.dataplane"
ACCURACY = "query.accuracy"


@dataclass
class Hello:
    """Server -> every node when a run starts or resumes: the run's configuration (JSON). Where the
    node keeps its state and its privacy ledger is the node's own choice (its node config): a hello
    that names a directory (``state_dir``, kept only to be refused) is refused."""

    config: str
    state_dir: str = ""


@dataclass
class HelloReply:
    """The node's client id; what its ledger already holds (with the ledger when not empty); or a
    refusal under its own privacy policy."""

    client_id: int
    ledger_queries: int | None = None
    ledger: str | None = None
    refused: bool | None = None
    reason: str | None = None


@dataclass
class LedgerQuery:
    """Server -> client at the end of a run: send your ledger."""


@dataclass
class LedgerReply:
    ledger: str  # PrivacyLedger.state_dict() as JSON (whose it is: the node the reply came from)
    own_ledger: str | None = None  # through secure sums: its own noise shares' ledger (a deviating server's)


@dataclass
class CarriedLedger:
    """The ``ledger`` field of any reply that carries one (hello, ledger, a DPGAN round): how the
    server's shell reads a node's ledger from whichever reply brings it."""

    ledger: str | None = None
    own_ledger: str | None = None  # a ledger reply's record of its own noise shares (secure sums)


@dataclass
class DataplaneStart:
    """Server -> node (through Flower): start the persistent data-plane worker for this run."""

    address: str
    token: str
    run_id: int
    ca: str
    idle_s: float


@dataclass
class DataplaneReply:
    status: str
    pid: int | None = None


@dataclass
class AccuracyQuery:
    """The debugging task's selection query: this classifier's accuracy on your data, released with
    noise multiplier ``noise_multiplier`` (``common/evaluation/selection.py``)."""

    noise_multiplier: float
    classifier: StateDict


@dataclass
class AccuracyReply:
    accuracy: float  # -1 when refused
    refused: bool
    reason: str


SHARED = {
    HELLO: (Hello, HelloReply),
    LEDGER: (LedgerQuery, LedgerReply),
    DATAPLANE: (DataplaneStart, DataplaneReply),
    ACCURACY: (AccuracyQuery, AccuracyReply),
    **SECAGG,  # the secure sum's four rounds (common/secagg/messages.py)
}
