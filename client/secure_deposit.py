"""What a node keeps for its secure sums besides their sessions: its deposits and its identity.

A deposit is the node's encoded release for one sum (``deposit_input``), kept in ``context.state``
with the terms its noise share was calibrated for (``DepositTerms``). A sum that aborts because of
a named peer is re-formed without it from the same deposits, so the honest nodes are not charged
again (audit 4, item 10); a deposit therefore outlives a session, under three rules:

- it is masked in at most ``MAX_SESSIONS`` sessions, and only the latest (its *live* session) may
  be unmasked: the server never sees two unmasked sums of one deposit, whose difference would
  reveal it;
- once a session has unmasked it, it is spent and deleted;
- a session the node abandons (a newer one for the same deposit) is closed: it answers nothing more.

The identity (``common/secagg/identity.py``): the node's signing key and the federation's published
keys, from its own root or node config; None when it has neither (it then verifies no peer).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ArrayRecord, ConfigRecord, Context

from common.secagg import DepositTerms, SecAggError, input_problem, public_key_bytes, session_problem
from common.secagg.identity import (
    SIMULATED_FILE,
    identity_path,
    load_identity,
    load_peers,
    peers_path,
    simulated_identity,
)
from protos import wire

INPUT_PREFIX = "secagg-input."
TERMS_PREFIX = "secagg-terms."
INPUT_KEY = "x"
MAX_SESSIONS = 4  # sessions one deposit may be masked in: the first and up to three re-formed sums


class Refused(Exception):
    """This node will not go on with the session; the message is the reason the server is told."""


# --- deposits -------------------------------------------------------------------------------------
def deposit_input(context: Context, session: str, vector: np.ndarray, *, floor: int, bound: int) -> None:
    """Leave this node's input for ``session``: a 1-D integer vector in ±``bound`` whose noise share
    was calibrated for sums of at least ``floor`` inputs. The terms are kept with it: a sum declared
    with a lower floor, another range or length is refused at its first round (``DepositTerms``)."""
    problem = session_problem(session)
    vector = np.asarray(vector)
    if problem or vector.ndim != 1 or vector.dtype.kind not in "iu":
        raise ValueError(problem or f"a secure sum's input is a 1-D integer vector, got {vector.dtype} {vector.shape}")
    if floor < 2 or bound < 1:
        raise ValueError(f"a deposit needs a floor >= 2 and a range >= 1, got floor {floor}, range {bound}")
    out_of_range = input_problem(vector, bound=bound, length=vector.size)
    if out_of_range:
        raise ValueError(f"the deposit is refused: {out_of_range}")
    terms = DepositTerms(floor=int(floor), bound=int(bound), length=int(vector.size))
    context.state[INPUT_PREFIX + session] = ArrayRecord({INPUT_KEY: wire.raw_array(vector)})
    context.state[TERMS_PREFIX + session] = ConfigRecord({**dataclasses.asdict(terms), "live": "", "sessions": 0})


def deposit_terms(context: Context, deposit: str) -> DepositTerms | None:
    """The terms of this node's deposit ``deposit`` (None: nothing is deposited under that name)."""
    record = _record(context, deposit)
    if record is None:
        return None
    return DepositTerms(**{f.name: int(record[f.name]) for f in dataclasses.fields(DepositTerms)})


def _record(context: Context, deposit: str) -> ConfigRecord | None:
    if INPUT_PREFIX + deposit not in context.state or TERMS_PREFIX + deposit not in context.state:
        return None
    return context.state.config_records[TERMS_PREFIX + deposit]


def open_for(context: Context, deposit: str, session: str) -> str:
    """Make ``session`` the deposit's live session; returns the session it replaces ("" if none),
    which the caller closes. Refused when the deposit is missing or was masked too often."""
    record = _record(context, deposit)
    if record is None:
        raise Refused(f"no input was deposited for session {deposit} on this node")
    if int(record["sessions"]) >= MAX_SESSIONS:
        raise Refused(f"deposit {deposit} was already offered to {MAX_SESSIONS} sums; it is offered to no more")
    previous = str(record["live"])
    record["live"], record["sessions"] = session, int(record["sessions"]) + 1
    return previous


def live_input(context: Context, deposit: str, session: str) -> np.ndarray:
    """The deposited vector, for ``session`` only if it is the deposit's live session."""
    record = _record(context, deposit)
    if record is None or str(record["live"]) != session:
        raise Refused(f"session {session} is not the live sum of deposit {deposit} on this node")
    return wire.array_to_numpy(INPUT_KEY, context.state.array_records[INPUT_PREFIX + deposit][INPUT_KEY])


def spend(context: Context, deposit: str) -> None:
    """The deposit was unmasked in its live session: it is deleted and can join no other sum."""
    for key in (INPUT_PREFIX + deposit, TERMS_PREFIX + deposit):
        if key in context.state:
            del context.state[key]


# --- identity -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """The node's signing key, its public key, and the federation's published keys."""

    key: ec.EllipticCurvePrivateKey
    public: bytes
    peers: frozenset[bytes]


def node_identity(node_config: dict, root: str, client_id: int) -> tuple[Identity | None, str]:
    """(this node's identity or None, why it cannot be used), from its node config's files or its
    ``root``. None with "" when it has neither file: the node then verifies no peer. Files that exist
    but cannot be used are a problem (fail closed)."""
    key_file = str(node_config.get("secagg-identity") or (identity_path(root, client_id) if root else ""))
    peers_file = str(node_config.get("secagg-peers") or (peers_path(root) if root else ""))
    if not key_file or not peers_file:
        return None, ""
    simulated = Path(root) / SIMULATED_FILE if root and not node_config.get("secagg-identity") else None
    if simulated is not None and not Path(key_file).is_file() and simulated.is_file():
        return _cached_simulated(str(simulated), client_id, peers_file, _mtime(str(simulated)), _mtime(peers_file))
    return _cached_identity(key_file, peers_file, _mtime(key_file), _mtime(peers_file))


@functools.lru_cache(maxsize=4096)
def _cached_simulated(
    secret_file: str, client_id: int, peers_file: str, secret_mtime: float, peers_mtime: float
) -> tuple[Identity | None, str]:
    """A simulated node's identity, derived from its simulation's secret (``provision_simulated``)."""
    try:
        key = simulated_identity(Path(secret_file).read_bytes(), client_id)
        peers = _peers(peers_file, peers_mtime)
    except (OSError, SecAggError) as err:
        return None, str(err)
    public = public_key_bytes(key)
    if public not in peers:
        return None, f"simulated client {client_id}'s identity is not among the published keys {peers_file}"
    return Identity(key, public, peers), ""


@functools.lru_cache(maxsize=8)
def _peers(peers_file: str, peers_mtime: float) -> frozenset[bytes]:
    """The published keys, read once per file version (every simulated node of a process shares them)."""
    return load_peers(peers_file)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return -1.0


@functools.lru_cache(maxsize=64)
def _cached_identity(
    key_file: str, peers_file: str, key_mtime: float, peers_mtime: float
) -> tuple[Identity | None, str]:
    have = [Path(key_file).is_file(), Path(peers_file).is_file()]
    if not any(have):
        return None, ""
    if not all(have):
        missing = key_file if not have[0] else peers_file
        return None, f"{missing} is missing (a node verifies its peers with both its identity and the published keys)"
    try:
        key = load_identity(key_file)
        peers = _peers(peers_file, peers_mtime)
    except SecAggError as err:
        return None, str(err)
    public = public_key_bytes(key)
    if public not in peers:
        return None, f"this node's identity key {key_file} is not among the federation's published keys {peers_file}"
    return Identity(key, public, peers), ""
