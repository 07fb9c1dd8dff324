"""A node's state of each secure sum it is in, and what it checks of its peers' identities.

Kept in ``context.state`` (``secure_sum.py`` answers the rounds): one ``Session`` per sum, its
private keys and what it learnt; a server that opens sessions and never finishes them cannot fill
the node's memory (``make_room``). A verifying node (one with an identity, ``secure_deposit.py``)
checks at round 2 that every neighbour is a published identity, distinct, that signed its keys for
this session (``verify_peers``), and at round 3 that each share it receives carries its owner's
signature (``signed_by_owner``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, Context

from common.secagg import NODE_IDS, PUBLIC_KEY_BYTES, unpack_bytes
from common.secagg.identity import advertise_message, digest, share_message, verifies
from common.secagg.messages import ShareKeys

from .secure_deposit import Identity, Refused

SESSION_PREFIX = "secagg."
MAX_OPEN_SESSIONS = 8  # a server that opens sessions and never finishes them cannot fill the node's memory


@dataclass
class Session:
    """One sum's state on this node: its parameters, its private keys and what it learnt since."""

    stage: str  # the last round answered: advertise, share, mask
    deposit: str  # the deposit it sums
    cohort: int
    threshold: int
    degree: int
    bits: int
    bound: int
    length: int
    min_inputs: int
    mask_sk: bytes
    cipher_sk: bytes
    verifies: bool = False  # the node has an identity: it checks its peers' and signs its own
    opened_ns: int = field(default_factory=time.time_ns)
    seed: bytes = b""
    neighbours: bytes = b""  # uint64 ids, in the order of the key tables
    mask_keys: bytes = b""  # their mask public keys, 33 bytes each
    cipher_keys: bytes = b""
    identities: bytes = b""  # their identity keys, 33 bytes each (a verifying node's, checked at round 2)
    pair_keys: list[bytes] = field(default_factory=list)  # the cipher key agreed with each, in their order
    holders: bytes = b""  # uint64 ids whose shares this node holds (itself first)
    seed_shares: list[bytes] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)
    signatures: list[bytes] = field(default_factory=list)  # each holder row's owner signature (b"": none)

    def neighbour_ids(self) -> list[int]:
        return np.frombuffer(self.neighbours, NODE_IDS).tolist()

    def public_key(self, table: bytes, node: int) -> bytes:
        """The public key ``node`` advertised, from one of the two key tables."""
        i = self.neighbour_ids().index(node)
        return table[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES]


# --- session state in context.state ---------------------------------------------------------------
def save(context: Context, session: str, state: Session) -> None:
    context.state[SESSION_PREFIX + session] = ConfigRecord(dataclasses.asdict(state))


def load(context: Context, session: str, after: str) -> Session:
    """The session's state, which must have answered round ``after`` last (rounds run in order)."""
    key = SESSION_PREFIX + session
    if key not in context.state:
        raise Refused(f"session {session} is not open on this node (never advertised, finished or evicted)")
    record = context.state.config_records[key]
    state = Session(**{f.name: _field(record, f.name) for f in dataclasses.fields(Session)})
    if state.stage != after:
        raise Refused(f"session {session} answered round {state.stage!r} last; round {after!r} must come first")
    return state


def _field(record: ConfigRecord, name: str) -> object:
    value = record[name]
    return list(value) if isinstance(value, list) else value


def close(context: Context, session: str) -> None:
    if SESSION_PREFIX + session in context.state:
        del context.state[SESSION_PREFIX + session]


def make_room(context: Context) -> None:
    """Forget the oldest open sessions beyond ``MAX_OPEN_SESSIONS`` - 1 (a sum the server abandoned)."""
    open_ = [k for k in context.state.config_records if k.startswith(SESSION_PREFIX)]
    open_.sort(key=lambda k: int(context.state.config_records[k]["opened_ns"]))
    for key in open_[: max(0, len(open_) - MAX_OPEN_SESSIONS + 1)]:
        close(context, key[len(SESSION_PREFIX) :])


def verify_peers(request: ShareKeys, neighbours: list[int], identity: Identity | None, session: str) -> None:
    """Each neighbour a distinct published identity other than this node's, its keys signed by it."""
    if identity is None:
        raise Refused("this node's identity is no longer readable: it verifies no peer and joins no sum")
    n = len(neighbours)
    identities, sigs = request.identities, request.signatures
    if identities is None or sigs is None or request.signature_lengths is None:
        raise Refused("the server sent no identities: this node takes part only with peers it can verify")
    if identities.dtype != np.uint8 or identities.shape != (n, PUBLIC_KEY_BYTES):
        raise Refused(f"an identity table of {identities.dtype} {identities.shape} for {n} neighbours")
    signatures = unpack_bytes(sigs, request.signature_lengths)
    rows = [bytes(row) for row in identities]
    unknown = [node for node, row in zip(neighbours, rows, strict=True) if row not in identity.peers]
    if unknown:
        raise Refused(
            f"neighbour(s) {unknown[:5]} are not among the federation's published keys: a server may fill a "
            "sum with keys of its own, so this node joins none whose peers it cannot verify"
        )
    if len(set(rows)) != n or identity.public in rows:
        raise Refused("two neighbours share one identity, or a neighbour has this node's: a sybil")
    for i, node in enumerate(neighbours):
        message = advertise_message(session, node, bytes(request.mask_keys[i]), bytes(request.cipher_keys[i]))
        if not verifies(rows[i], signatures[i], message):
            raise Refused(f"neighbour {node}'s keys are not signed by its identity for this session")


def signed_by_owner(session: str, state: Session, sender: int, own: int, shares: tuple[bytes, bytes, bytes]) -> bool:
    """Whether ``sender`` signed the shares it handed this node (its identity, checked at round 2)."""
    seed, key, signature = shares
    identity = state.public_key(state.identities, sender)
    return verifies(identity, signature, share_message(session, sender, own, digest(seed), digest(key)))
