"""The node's side of a secure sum (SecAgg+, Bell et al. 2020): one handler per round.

A caller on the node (a method's answer; for now the tests) deposits the node's input for a session
with ``deposit_input``; the server then drives four rounds (``server/secure_sum.py``):

1. ``query.secagg_advertise``: check the sum's parameters against the protocol's rules and the
   node's own policy (``min-secagg-cohort``, ``min-secagg-threshold``), then make two fresh key pairs.
2. ``query.secagg_share``: draw a self-mask seed, Shamir-share it and the mask key among the
   neighbours (threshold t), and encrypt each neighbour's shares for it alone.
3. ``query.secagg_mask``: take the deposited input, refuse it unless every coordinate is within the
   declared range, and add the self mask and one pairwise mask per neighbour that shared, mod 2^b.
4. ``query.secagg_unmask``: give the server self-mask shares of the neighbours whose inputs are in
   the sum and key shares of those that dropped after sharing, never both for one node, and only
   when at least t of the neighbourhood survived; then forget the session.

Secrets live in ``context.state`` (the node's memory, kept by Flower between a run's messages; the
data-plane worker keeps its own context), never on disk and never in a reply. Every refusal names
its cause and leaves the node out of that sum; the server counts it as a dropout.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import time
from dataclasses import dataclass, field

import numpy as np
from cryptography.fernet import InvalidToken
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key

from common.secagg import (
    NODE_IDS,
    PUBLIC_KEY_BYTES,
    SEED_BYTES,
    DepositTerms,
    SecAggError,
    encode_inputs,
    fewest_inputs,
    input_problem,
    mask_dtype,
    modulus_mask,
    new_private_key,
    node_ids,
    pack_bytes,
    pair_mask,
    pairwise_sign,
    parameter_problems,
    parse_share_plaintext,
    private_key_bytes,
    private_key_from,
    public_key_bytes,
    public_key_from,
    self_mask,
    session_problem,
    share_plaintext,
    unpack_bytes,
)
from common.secagg_messages import (
    ADVERTISE,
    MASK,
    SHARE,
    UNMASK,
    AdvertiseKeys,
    AdvertiseReply,
    MaskedInput,
    MaskInput,
    ShareKeys,
    ShareReply,
    Unmask,
    UnmaskReply,
)
from protos import wire

from .node import node_policy

SESSION_PREFIX = "secagg."
INPUT_PREFIX = "secagg-input."
INPUT_KEY = "x"
TERMS_PREFIX = "secagg-terms."
MAX_OPEN_SESSIONS = 8  # a server that opens sessions and never finishes them cannot fill the node's memory


class Refused(Exception):
    """This node will not go on with the session; the message is the reason the server is told."""


@dataclass
class Session:
    """One sum's state on this node: its parameters, its private keys and what it learnt since."""

    stage: str  # the last round answered: advertise, share, mask
    cohort: int
    threshold: int
    degree: int
    bits: int
    bound: int
    length: int
    min_inputs: int
    mask_sk: bytes
    cipher_sk: bytes
    opened_ns: int = field(default_factory=time.time_ns)
    seed: bytes = b""
    neighbours: bytes = b""  # uint64 ids, in the order of the key tables
    mask_keys: bytes = b""  # their mask public keys, 33 bytes each
    cipher_keys: bytes = b""
    holders: bytes = b""  # uint64 ids whose shares this node holds (itself first)
    seed_shares: list[bytes] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)

    def neighbour_ids(self) -> list[int]:
        return np.frombuffer(self.neighbours, NODE_IDS).tolist()

    def public_key(self, table: bytes, node: int) -> bytes:
        """The public key ``node`` advertised, from one of the two key tables."""
        i = self.neighbour_ids().index(node)
        return table[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES]


# --- the caller's side: deposit the input ---------------------------------------------------------
def deposit_input(context: Context, session: str, vector: np.ndarray, *, floor: int, bound: int) -> None:
    """Leave this node's input for ``session``: a 1-D integer vector in ±``bound`` whose noise share
    was calibrated for sums of at least ``floor`` inputs. The terms are kept with it: a sum declared
    with a lower floor, another range or length is refused at its first round (``DepositTerms``); the
    input is masked in the third round (range-checked again) and then deleted."""
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
    context.state[TERMS_PREFIX + session] = ConfigRecord(dataclasses.asdict(terms))


def deposit_terms(context: Context, session: str) -> DepositTerms | None:
    """The terms of this node's deposit for ``session`` (None: nothing is deposited for it)."""
    key = TERMS_PREFIX + session
    if INPUT_PREFIX + session not in context.state or key not in context.state:
        return None
    record = context.state.config_records[key]
    return DepositTerms(**{f.name: int(record[f.name]) for f in dataclasses.fields(DepositTerms)})


def _take_input(context: Context, session: str) -> tuple[np.ndarray, DepositTerms]:
    """The deposited input and its terms, removed from the node's state (an input is masked at most once)."""
    terms = deposit_terms(context, session)
    if terms is None:
        raise Refused(f"no input was deposited for session {session} on this node")
    record = context.state.array_records[INPUT_PREFIX + session]
    for key in (INPUT_PREFIX + session, TERMS_PREFIX + session):
        del context.state[key]
    return wire.array_to_numpy(INPUT_KEY, record[INPUT_KEY]), terms


# --- session state in context.state ---------------------------------------------------------------
def _save(context: Context, session: str, state: Session) -> None:
    context.state[SESSION_PREFIX + session] = ConfigRecord(dataclasses.asdict(state))


def _load(context: Context, session: str, after: str) -> Session:
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


def _close(context: Context, session: str) -> None:
    for key in (SESSION_PREFIX + session, INPUT_PREFIX + session, TERMS_PREFIX + session):
        if key in context.state:
            del context.state[key]


def _make_room(context: Context) -> None:
    """Forget the oldest open sessions beyond ``MAX_OPEN_SESSIONS`` - 1 (a sum the server abandoned)."""
    open_ = [k for k in context.state.config_records if k.startswith(SESSION_PREFIX)]
    open_.sort(key=lambda k: int(context.state.config_records[k]["opened_ns"]))
    for key in open_[: max(0, len(open_) - MAX_OPEN_SESSIONS + 1)]:
        _close(context, key[len(SESSION_PREFIX) :])


# --- round 1: advertise keys ----------------------------------------------------------------------
def handle_advertise(message: Message, context: Context) -> Message:
    """Check the sum against the protocol and the node's policy; answer with two fresh public keys."""
    request = wire.decode(AdvertiseKeys, message.content)
    problem = _advertise_problem(request, context)
    if problem:
        return wire.reply(AdvertiseReply(refused=True, reason=f"node refuses the secure sum: {problem}"), message)
    _make_room(context)
    mask_sk, cipher_sk = new_private_key(), new_private_key()
    secret_keys = {"mask_sk": private_key_bytes(mask_sk), "cipher_sk": private_key_bytes(cipher_sk)}
    state = Session(stage="advertise", **secret_keys, **_parameters(request))
    _save(context, request.session, state)
    keys = {
        k: np.frombuffer(public_key_bytes(sk), np.uint8) for k, sk in (("mask_key", mask_sk), ("cipher_key", cipher_sk))
    }
    return wire.reply(AdvertiseReply(refused=False, reason="", **keys), message)


def _advertise_problem(request: AdvertiseKeys, context: Context) -> str:
    """Why this node will not take part in the sum ``request`` describes ("")."""
    if session_problem(request.session):
        return session_problem(request.session)
    if SESSION_PREFIX + request.session in context.state:
        return f"session {request.session} is already open on this node (a session is run once)"
    reasons = parameter_problems(**_parameters(request))
    floor = fewest_inputs(request.threshold, request.min_inputs)
    terms = deposit_terms(context, request.session)
    if terms is None:
        return f"no input was deposited for session {request.session} on this node"
    reasons += terms.problems(floor=floor, bound=request.bound, length=request.length)
    policy, broken = node_policy(context)
    own = [broken] if broken else policy.secagg_violations(cohort=request.cohort, threshold=floor)
    if own:
        reasons.append("; ".join(own) + f" [{policy.source}]")
    return "; ".join(reasons)


def _parameters(request: AdvertiseKeys) -> dict[str, int]:
    return {k: getattr(request, k) for k in ("cohort", "threshold", "degree", "bits", "bound", "length", "min_inputs")}


# --- round 2: share keys --------------------------------------------------------------------------
def handle_share(message: Message, context: Context) -> Message:
    """Shamir-share a fresh self-mask seed and the mask key among the neighbours, each neighbour's
    shares encrypted for it alone (Flower's ECDH + HKDF key, Fernet)."""
    request = wire.decode(ShareKeys, message.content)
    try:
        state = _load(context, request.session, after="advertise")
        neighbours = _neighbours(request, state, own=context.node_id)
    except (Refused, SecAggError) as err:
        return wire.reply(ShareReply(refused=True, reason=str(err)), message)
    state.seed = os.urandom(SEED_BYTES)
    holders = len(neighbours) + 1
    seed_shares = create_shares(state.seed, state.threshold, holders)
    key_shares = create_shares(state.mask_sk, state.threshold, holders)
    state.neighbours = node_ids(neighbours).tobytes()
    state.mask_keys, state.cipher_keys = request.mask_keys.tobytes(), request.cipher_keys.tobytes()
    cipher_sk, tokens = private_key_from(state.cipher_sk), []
    for i, node in enumerate(neighbours, start=1):
        key = generate_shared_key(cipher_sk, public_key_from(state.public_key(state.cipher_keys, node)))
        plaintext = share_plaintext(request.session, context.node_id, node, seed_shares[i], key_shares[i])
        tokens.append(base64.urlsafe_b64decode(encrypt(key, plaintext)))  # raw bytes on the wire
    state.holders, state.seed_shares, state.key_shares = (
        node_ids([context.node_id]).tobytes(),
        seed_shares[:1],
        key_shares[:1],
    )
    state.stage = "share"
    _save(context, request.session, state)
    flat, lengths = pack_bytes(tokens)
    return wire.reply(
        ShareReply(False, "", recipients=node_ids(neighbours), ciphertexts=flat, lengths=lengths), message
    )


def _neighbours(request: ShareKeys, state: Session, *, own: int) -> list[int]:
    """The neighbours the server named, checked: distinct, not this node, no more than the degree,
    enough to hold t shares, each with two distinct valid keys."""
    ids = request.neighbours
    if ids.dtype != NODE_IDS or ids.ndim != 1:
        raise Refused(f"neighbour ids of dtype {ids.dtype}, shape {ids.shape}")
    neighbours = ids.tolist()
    n = len(neighbours)
    if len(set(neighbours)) != n or own in neighbours:
        raise Refused("the neighbour list repeats a node or names this node")
    if not (state.threshold - 1 <= n <= state.degree):
        raise Refused(f"{n} neighbours: at least {state.threshold - 1} (threshold) and at most {state.degree}")
    for table in (request.mask_keys, request.cipher_keys):
        if table.dtype != np.uint8 or table.shape != (n, PUBLIC_KEY_BYTES):
            raise Refused(f"a key table of {table.dtype} {table.shape} for {n} neighbours")
    keys = [bytes(row) for row in np.concatenate([request.mask_keys, request.cipher_keys])]
    if len(set(keys)) != len(keys):
        raise Refused("two neighbours' public keys are identical")
    for key in keys:
        public_key_from(key)
    return neighbours


# --- round 3: mask the input ----------------------------------------------------------------------
def handle_mask(message: Message, context: Context) -> Message:
    """Decrypt the shares the neighbours sent, then answer the deposited input (range-checked) plus
    the self mask and one pairwise mask per sender, mod 2^b."""
    request = wire.decode(MaskInput, message.content)
    try:
        state = _load(context, request.session, after="share")
        vector, terms = _take_input(context, request.session)
        problem = input_problem(vector, bound=min(state.bound, terms.bound), length=state.length)
        if problem:
            raise Refused(f"node refuses to mask its input: {problem}")
        senders = _receive_shares(request, state, own=context.node_id)
    except (Refused, SecAggError) as err:
        _close(context, request.session)
        return wire.reply(MaskedInput(refused=True, reason=str(err)), message)
    masked = _masked(vector, state, senders, request.session, own=context.node_id)
    state.stage = "mask"
    _save(context, request.session, state)
    return wire.reply(MaskedInput(refused=False, reason="", masked=masked), message)


def _receive_shares(request: MaskInput, state: Session, *, own: int) -> list[int]:
    """The senders, after each one's ciphertext decrypted and named this session and pair; their
    shares kept. Refused unless at least t - 1 neighbours shared (with this node: t holders)."""
    senders = request.senders.tolist() if request.senders.dtype == NODE_IDS else []
    if request.senders.dtype != NODE_IDS or len(set(senders)) != len(senders):
        raise Refused("malformed or repeated senders")
    if not set(senders) <= set(state.neighbour_ids()):
        raise Refused("a share from a node that is not this node's neighbour")
    if len(senders) + 1 < state.threshold:
        raise Refused(f"only {len(senders)} neighbours shared their keys; threshold {state.threshold} needs more")
    cipher_sk = private_key_from(state.cipher_sk)
    for sender, token in zip(senders, unpack_bytes(request.ciphertexts, request.lengths), strict=True):
        key = generate_shared_key(cipher_sk, public_key_from(state.public_key(state.cipher_keys, sender)))
        try:
            plaintext = decrypt(key, base64.urlsafe_b64encode(token))
        except InvalidToken:
            raise Refused(f"the ciphertext from node {sender} does not authenticate") from None
        seed_share, key_share = parse_share_plaintext(plaintext, session=request.session, src=sender, dst=own)
        state.seed_shares.append(seed_share)
        state.key_shares.append(key_share)
    state.holders += node_ids(senders).tobytes()
    return senders


def _masked(vector: np.ndarray, state: Session, senders: list[int], session: str, *, own: int) -> np.ndarray:
    """x + PRG(seed) + Σ ±PRG(pair key) mod 2^b, in the narrowest dtype that holds b bits."""
    length, bits = state.length, state.bits
    total = encode_inputs(vector) + self_mask(state.seed, length, bits, session=session)
    mask_sk = private_key_from(state.mask_sk)
    for node in senders:
        shared = generate_shared_key(mask_sk, public_key_from(state.public_key(state.mask_keys, node)))
        mask = pair_mask(shared, length, bits, session=session, pair=(own, node))
        total = total + mask if pairwise_sign(own, node) > 0 else total - mask
    return (total & modulus_mask(bits)).astype(mask_dtype(bits))


# --- round 4: unmask ------------------------------------------------------------------------------
def handle_unmask(message: Message, context: Context) -> Message:
    """Self-mask shares for the survivors (this node among them), key shares for the dropped: never
    both for one node, and only when at least t of this neighbourhood's inputs are in the sum."""
    request = wire.decode(Unmask, message.content)
    try:
        state = _load(context, request.session, after="mask")
        survivors, dropped = _unmask_lists(request, state, own=context.node_id)
    except (Refused, SecAggError) as err:
        return wire.reply(UnmaskReply(refused=True, reason=str(err)), message)
    finally:
        _close(context, request.session)  # answered or refused, the session is over for this node
    held = dict(zip(np.frombuffer(state.holders, NODE_IDS).tolist(), range(len(state.seed_shares)), strict=True))
    seeds = [state.seed_shares[held[n]] for n in [context.node_id, *survivors]]
    keys = [state.key_shares[held[n]] for n in dropped]
    width = len(seeds[0])
    reply = UnmaskReply(
        refused=False,
        reason="",
        seed_owners=node_ids([context.node_id, *survivors]),
        seed_shares=np.frombuffer(b"".join(seeds), np.uint8).reshape(len(seeds), width),
        key_owners=node_ids(dropped),
        key_shares=np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), len(keys[0]) if keys else width),
    )
    return wire.reply(reply, message)


def _unmask_lists(request: Unmask, state: Session, *, own: int) -> tuple[list[int], list[int]]:
    """The survivors and the dropped, checked: disjoint, among the nodes that shared with this one,
    and at least t inputs of this neighbourhood (this node's too) in the sum."""
    if request.survivors.dtype != NODE_IDS or request.dropped.dtype != NODE_IDS:
        raise Refused("malformed survivor or dropout ids")
    survivors, dropped = request.survivors.tolist(), request.dropped.tolist()
    partners = set(np.frombuffer(state.holders, NODE_IDS).tolist()) - {own}
    if set(survivors) & set(dropped) or len(set(survivors)) != len(survivors) or len(set(dropped)) != len(dropped):
        raise Refused("a node listed twice, or both as a survivor and as dropped")
    if not (set(survivors) | set(dropped)) <= partners:
        raise Refused("survivors or dropouts that did not share keys with this node")
    if len(survivors) + 1 < state.threshold:
        raise Refused(
            f"only {len(survivors) + 1} inputs of this neighbourhood are in the sum; threshold {state.threshold}"
        )
    return survivors, dropped


HANDLERS = {ADVERTISE: handle_advertise, SHARE: handle_share, MASK: handle_mask, UNMASK: handle_unmask}
