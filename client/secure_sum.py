"""The node's side of a secure sum (SecAgg+, Bell et al. 2020): one handler per round.

A caller on the node (a method's answer) deposits the node's input with ``deposit_input``
(``secure_deposit.py``); the server then drives four rounds (``server/secure_sum.py``):

1. ``query.secagg_advertise``: check the sum against the protocol's rules, the node's own policy
   and its deposit's terms (floor, range, length), then make two fresh key pairs and sign them with
   the node's identity (``common/secagg/identity.py``).
2. ``query.secagg_share``: check each neighbour (a verifying node: its identity is one the federation
   published, distinct from the others, its signature valid), draw a self-mask seed, commit to it,
   Shamir-share it and the mask key among the neighbours (threshold t), sign each neighbour's shares
   and encrypt them for that neighbour alone.
3. ``query.secagg_mask``: open what each neighbour sent; a share that does not decrypt, name this
   session and pair, or carry its owner's signature names that owner (``blamed``) with a proof the
   server checks (``common/secagg/proof.py``), and the node masks nothing. Else the deposited input,
   range-checked, plus the self mask and one pairwise mask per sender, mod 2^b.
4. ``query.secagg_unmask``: give the server self-mask shares of the neighbours whose inputs are in
   the sum and key shares of those that dropped after sharing, never both for one node, each with
   its owner's signature, and only when enough of the neighbourhood survived; the deposit is spent.

Secrets live in ``context.state`` (the node's memory, kept by Flower between a run's messages; the
data-plane worker keeps its own context), never on disk and never in a reply. Every refusal names
its cause and leaves the node out of that sum; the server counts it as a dropout.
"""

from __future__ import annotations

import base64
import os

import numpy as np
from cryptography.fernet import InvalidToken
from flwr.app import Context, Message
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key

from common.secagg import (
    NODE_IDS,
    PUBLIC_KEY_BYTES,
    SEED_BYTES,
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
from common.secagg.identity import advertise_message, digest, seed_commitment, share_message, sign
from common.secagg.messages import (
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
from common.secagg.proof import prove_shared_point
from common.secagg.shamir import create_shares
from protos import wire

from .node import client_id_of, node_policy, node_root
from .secure_deposit import (
    Identity,
    Refused,
    deposit_input,
    deposit_terms,
    live_input,
    node_identity,
    open_for,
    spend,
)
from .secure_session import SESSION_PREFIX, Session, close, load, make_room, save, signed_by_owner, verify_peers

__all__ = ["HANDLERS", "deposit_input"]


def _identity(context: Context) -> tuple[Identity | None, str]:
    return node_identity(dict(context.node_config), node_root(context), client_id_of(context))


# --- round 1: advertise keys ----------------------------------------------------------------------
def handle_advertise(message: Message, context: Context) -> Message:
    """Check the sum against the protocol, the node's policy and its deposit; answer with two fresh
    public keys, signed by the node's identity where it has one."""
    request = wire.decode(AdvertiseKeys, message.content)
    deposit = request.deposit or request.session
    identity, broken = _identity(context)
    try:
        problem = broken or _advertise_problem(request, deposit, context)
        if problem:
            raise Refused(problem)
        replaced = open_for(context, deposit, request.session)
    except Refused as err:
        return wire.reply(AdvertiseReply(refused=True, reason=f"node refuses the secure sum: {err}"), message)
    if replaced and replaced != request.session:
        close(context, replaced)  # an abandoned sum of this deposit: it answers nothing more
    make_room(context)
    mask_sk, cipher_sk = new_private_key(), new_private_key()
    secret_keys = {"mask_sk": private_key_bytes(mask_sk), "cipher_sk": private_key_bytes(cipher_sk)}
    state = Session(
        stage="advertise", deposit=deposit, verifies=identity is not None, **secret_keys, **_parameters(request)
    )
    save(context, request.session, state)
    mask_key, cipher_key = public_key_bytes(mask_sk), public_key_bytes(cipher_sk)
    own, signature = b"", b""
    if identity is not None:
        own = identity.public
        signature = sign(identity.key, advertise_message(request.session, context.node_id, mask_key, cipher_key))
    reply = AdvertiseReply(
        refused=False,
        reason="",
        mask_key=_bytes(mask_key),
        cipher_key=_bytes(cipher_key),
        identity=_bytes(own),
        signature=_bytes(signature),
    )
    return wire.reply(reply, message)


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8).copy()


def _advertise_problem(request: AdvertiseKeys, deposit: str, context: Context) -> str:
    """Why this node will not take part in the sum ``request`` describes ("")."""
    if session_problem(request.session) or session_problem(deposit):
        return session_problem(request.session) or session_problem(deposit)
    if SESSION_PREFIX + request.session in context.state:
        return f"session {request.session} is already open on this node (a session is run once)"
    reasons = parameter_problems(**_parameters(request))
    floor = fewest_inputs(request.threshold, request.min_inputs)
    terms = deposit_terms(context, deposit)
    if terms is None:
        return f"no input was deposited for session {deposit} on this node"
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
    shares signed and encrypted for it alone (Flower's ECDH + HKDF key, Fernet)."""
    request = wire.decode(ShareKeys, message.content)
    identity, _ = _identity(context)
    try:
        state = load(context, request.session, after="advertise")
        neighbours = _neighbours(request, state, own=context.node_id, identity=identity)
    except (Refused, SecAggError) as err:
        return wire.reply(ShareReply(refused=True, reason=str(err)), message)
    own, session = context.node_id, request.session
    state.seed = os.urandom(SEED_BYTES)
    holders = len(neighbours) + 1
    seed_shares = create_shares(state.seed, state.threshold, holders)
    key_shares = create_shares(state.mask_sk, state.threshold, holders)
    state.neighbours = node_ids(neighbours).tobytes()
    state.mask_keys, state.cipher_keys = request.mask_keys.tobytes(), request.cipher_keys.tobytes()
    state.identities = request.identities.tobytes() if state.verifies else b""
    cipher_sk, tokens, state.pair_keys = private_key_from(state.cipher_sk), [], []
    signatures = [_share_signature(identity, session, own, own, seed_shares[0], key_shares[0])]
    for i, node in enumerate(neighbours, start=1):
        key = generate_shared_key(cipher_sk, public_key_from(state.public_key(state.cipher_keys, node)))
        state.pair_keys.append(key)  # round 3 opens this neighbour's ciphertext with the same key
        signature = _share_signature(identity, session, own, node, seed_shares[i], key_shares[i])
        plaintext = share_plaintext(session, own, node, seed_shares[i], key_shares[i], signature)
        tokens.append(base64.urlsafe_b64decode(encrypt(key, plaintext)))  # raw bytes on the wire
    state.holders, state.seed_shares, state.key_shares = node_ids([own]).tobytes(), seed_shares[:1], key_shares[:1]
    state.signatures, state.stage = signatures, "share"
    save(context, session, state)
    flat, lengths = pack_bytes(tokens)
    commitment = _bytes(seed_commitment(session, own, state.seed))
    reply = ShareReply(False, "", node_ids(neighbours), flat, lengths, seed_commitment=commitment)
    return wire.reply(reply, message)


def _share_signature(
    identity: Identity | None, session: str, owner: int, holder: int, seed: bytes, key: bytes
) -> bytes:
    if identity is None:
        return b""
    return sign(identity.key, share_message(session, owner, holder, digest(seed), digest(key)))


def _neighbours(request: ShareKeys, state: Session, *, own: int, identity: Identity | None) -> list[int]:
    """The neighbours the server named, checked: distinct, not this node, no more than the degree,
    enough to hold t shares, each with two distinct valid keys, and (a verifying node) each with an
    identity the federation published, distinct, signing its keys for this session and node id."""
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
    if state.verifies:
        verify_peers(request, neighbours, identity, request.session)
    return neighbours


# --- round 3: mask the input ----------------------------------------------------------------------
def handle_mask(message: Message, context: Context) -> Message:
    """Open the shares the neighbours sent; blame a sender whose share cannot be used (and mask
    nothing), else answer the live deposit (range-checked) plus the self mask and one pairwise mask
    per sender, mod 2^b."""
    request = wire.decode(MaskInput, message.content)
    identity, _ = _identity(context)
    try:
        state = load(context, request.session, after="share")
        vector = live_input(context, state.deposit, request.session)
        problem = input_problem(vector, bound=state.bound, length=state.length)
        if problem:
            raise Refused(f"node refuses to mask its input: {problem}")
        senders, blamed = _receive_shares(request, state, own=context.node_id, identity=identity)
    except (Refused, SecAggError) as err:
        close(context, request.session)
        return wire.reply(MaskedInput(refused=True, reason=str(err)), message)
    if blamed:
        close(context, request.session)  # the server abandons the session; the deposit waits for another
        proofs = np.stack([_bytes(_blame_proof(state, node)) for node in blamed])
        reason = f"node cannot use the shares of {sorted(blamed)}; it names them, with proof"
        return wire.reply(MaskedInput(refused=True, reason=reason, blamed=node_ids(blamed), evidence=proofs), message)
    masked = _masked(vector, state, senders, request.session, own=context.node_id)
    state.stage = "mask"
    save(context, request.session, state)
    return wire.reply(MaskedInput(refused=False, reason="", masked=masked), message)


def _blame_proof(state: Session, node: int) -> bytes:
    """The pair's cipher point with its DLEQ proof: what lets the server open ``node``'s ciphertext."""
    return prove_shared_point(private_key_from(state.cipher_sk), state.public_key(state.cipher_keys, node))


def _receive_shares(
    request: MaskInput, state: Session, *, own: int, identity: Identity | None
) -> tuple[list[int], list[int]]:
    """(the senders whose shares this node keeps, the senders it blames). A share is blamed when its
    ciphertext does not authenticate, names another session or pair, or (a verifying node) lacks its
    owner's valid signature. Refused unless at least t - 1 neighbours shared."""
    senders = request.senders.tolist() if request.senders.dtype == NODE_IDS else []
    if request.senders.dtype != NODE_IDS or len(set(senders)) != len(senders):
        raise Refused("malformed or repeated senders")
    if not set(senders) <= set(state.neighbour_ids()):
        raise Refused("a share from a node that is not this node's neighbour")
    if len(senders) + 1 < state.threshold:
        raise Refused(f"only {len(senders)} neighbours shared their keys; threshold {state.threshold} needs more")
    blamed, index = [], {node: i for i, node in enumerate(state.neighbour_ids())}
    for sender, token in zip(senders, unpack_bytes(request.ciphertexts, request.lengths), strict=True):
        key = state.pair_keys[index[sender]]
        try:
            plaintext = decrypt(key, base64.urlsafe_b64encode(token))
            seed_share, key_share, signature = parse_share_plaintext(
                plaintext, session=request.session, src=sender, dst=own
            )
        except (InvalidToken, SecAggError, ValueError):
            blamed.append(sender)
            continue
        shares = (seed_share, key_share, signature)
        if state.verifies and not signed_by_owner(request.session, state, sender, own, shares):
            blamed.append(sender)
            continue
        state.seed_shares.append(seed_share)
        state.key_shares.append(key_share)
        state.signatures.append(signature)
        state.holders += node_ids([sender]).tobytes()
    return [s for s in senders if s not in blamed], blamed


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
    """Self-mask shares for the survivors (this node among them), key shares for the dropped, each
    with its owner's signature: never both for one node, only when at least t of this neighbourhood's
    inputs are in the sum, and only for the deposit's live session. The deposit is then spent."""
    request = wire.decode(Unmask, message.content)
    try:
        state = load(context, request.session, after="mask")
        live_input(context, state.deposit, request.session)  # an abandoned session unmasks nothing
        survivors, dropped = _unmask_lists(request, state, own=context.node_id, context=context)
    except (Refused, SecAggError) as err:
        close(context, request.session)
        return wire.reply(UnmaskReply(refused=True, reason=str(err)), message)
    close(context, request.session)
    spend(context, state.deposit)
    held = dict(zip(np.frombuffer(state.holders, NODE_IDS).tolist(), range(len(state.seed_shares)), strict=True))
    seed_rows = [held[n] for n in [context.node_id, *survivors]]
    key_rows = [held[n] for n in dropped]
    # each returned share travels with the other share's digest and the owner's signature on both
    seed_sigs, seed_lengths = pack_bytes([digest(state.key_shares[i]) + state.signatures[i] for i in seed_rows])
    key_sigs, key_lengths = pack_bytes([digest(state.seed_shares[i]) + state.signatures[i] for i in key_rows])
    width = len(state.seed_shares[0])
    keys = [state.key_shares[i] for i in key_rows]
    reply = UnmaskReply(
        refused=False,
        reason="",
        seed_owners=node_ids([context.node_id, *survivors]),
        seed_shares=np.frombuffer(b"".join(state.seed_shares[i] for i in seed_rows), np.uint8).reshape(
            len(seed_rows), width
        ),
        key_owners=node_ids(dropped),
        key_shares=np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), len(keys[0]) if keys else width),
        seed_signatures=seed_sigs,
        seed_signature_lengths=seed_lengths,
        key_signatures=key_sigs,
        key_signature_lengths=key_lengths,
    )
    return wire.reply(reply, message)


def _unmask_lists(request: Unmask, state: Session, *, own: int, context: Context) -> tuple[list[int], list[int]]:
    """The survivors and the dropped, checked: disjoint, among the nodes that shared with this one,
    and at least t inputs of this neighbourhood (this node's too) in the sum; a verifying node also
    counts them against its policy's minimum threshold (its peers are verified, the count is real)."""
    if request.survivors.dtype != NODE_IDS or request.dropped.dtype != NODE_IDS:
        raise Refused("malformed survivor or dropout ids")
    survivors, dropped = request.survivors.tolist(), request.dropped.tolist()
    partners = set(np.frombuffer(state.holders, NODE_IDS).tolist()) - {own}
    if set(survivors) & set(dropped) or len(set(survivors)) != len(survivors) or len(set(dropped)) != len(dropped):
        raise Refused("a node listed twice, or both as a survivor and as dropped")
    if not (set(survivors) | set(dropped)) <= partners:
        raise Refused("survivors or dropouts that did not share keys with this node")
    needed = state.threshold
    if state.verifies:
        needed = max(needed, node_policy(context)[0].min_secagg_threshold)
        if state.degree == state.cohort - 1:  # the complete graph: every input of the sum is a neighbour's
            needed = max(needed, fewest_inputs(state.threshold, state.min_inputs))
    if len(survivors) + 1 < needed:
        raise Refused(f"only {len(survivors) + 1} inputs of this neighbourhood are in the sum; it needs {needed}")
    return survivors, dropped


HANDLERS = {ADVERTISE: handle_advertise, SHARE: handle_share, MASK: handle_mask, UNMASK: handle_unmask}
