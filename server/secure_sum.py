"""The server's side of a secure sum (SecAgg+, Bell et al. 2020) over any transport.

``secure_sum(transport, nodes, ...)`` drives the four rounds (``client/secure_sum.py`` answers them)
through ``Transport.exchange``, so it runs unchanged in-process, under Flower's simulation, over
the data plane or a deployment. The server only ever holds public keys, ciphertexts it cannot read,
masked vectors (each uniform mod 2^b) and, at the end, t shares of exactly the secrets that remove
the masks of the inputs in the sum: the sum is all it learns. Nodes that fail, time out, refuse or
answer malformed are dropouts; dropouts after their keys were shared are recovered exactly from t
shares; fewer than t inputs, or a secret with fewer than t shares, abort the sum (nothing is
unmasked). An unmasked sum outside ±n·bound (n inputs) betrays an input outside its range: rejected.

A rogue peer is named, not just dropped (``secure_checks.py``, ``SecureSumResult.culprits``): keys
that do not verify at round 1, a ciphertext another node proves it cannot open at round 3 (the
session is then abandoned, unmasking nothing), a masked vector replayed from an earlier sum, a share
its owner did not sign at round 4. The caller re-forms a sum without its culprits from the same
deposits (``server/method_sums.py``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key

from common.io.codec import PayloadError
from common.secagg import (
    PUBLIC_KEY_BYTES,
    SecAggError,
    complete_degree,
    decode_signed,
    modulus_mask,
    neighbourhoods,
    new_session,
    node_ids,
    pack_bytes,
    pair_mask,
    pairwise_sign,
    parameter_problems,
    private_key_from,
    public_key_bytes,
    public_key_from,
    required_bits,
    self_mask,
    session_problem,
    unpack_bytes,
)
from common.secagg.identity import seed_commitment
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
from protos import wire

from .secure_checks import Advertised, HeldShare, advertise_problem, blame_culprit, collect_shares, rebuild
from .secure_run import STAGES, Aborted, SecureSumResult, SumRun

__all__ = ["STAGES", "Aborted", "SecureSumResult", "secure_sum"]
from .session import Transport, exchange_in_chunks
from .strategy import Outgoing


def secure_sum(
    transport: Transport,
    nodes: list[int],
    *,
    bound: int,
    length: int,
    threshold: int,
    degree: int | None = None,
    bits: int | None = None,
    session: str | None = None,
    timeout_s: float | None = None,
    rng: secrets.SystemRandom | None = None,
    min_inputs: int = 0,
    deposit: str = "",
    peers: frozenset[bytes] | None = None,
    seen: set[bytes] | None = None,
    on_round: Callable[[str], None] | None = None,
) -> SecureSumResult:
    """The sum of the integer vectors (``length`` coordinates in [-bound, bound]) that ``nodes`` hold
    for ``session`` (deposited on each node, ``client.secure_sum.deposit_input``), mod 2^bits.

    ``degree``: neighbours per node (default: the complete graph; ``common.secagg.sparse_degree``
    for Bell et al.'s k ≈ 2 log2 c); ``threshold``: shares that rebuild a secret, a strict majority
    of degree + 1, and the fewest inputs a revealed sum may hold; ``bits``: default
    ``required_bits(c, bound)``; ``min_inputs``: the fewest inputs a revealed sum may hold when that is
    more than the threshold (a sparse graph's threshold is a neighbourhood's; distributed noise is
    calibrated for this floor); ``deposit``: the deposit the nodes sum ("": the session's name; a
    re-formed sum names the first one's); ``peers``: the federation's published identities (a node
    advertising another is named); ``seen``: digests of the masked vectors of the caller's earlier
    sums (a node replaying one is named), updated; ``on_round``: told each round's name as it starts
    (the run's progress line). Raises SecAggError for parameters no node would accept."""
    cohort = sorted(set(nodes))
    degree = complete_degree(len(cohort)) if degree is None else degree
    bits = required_bits(len(cohort), bound) if bits is None else bits
    session = new_session() if session is None else session
    params = dict(
        cohort=len(cohort),
        threshold=threshold,
        degree=degree,
        bits=bits,
        bound=bound,
        length=length,
        min_inputs=min_inputs,
    )
    problems = parameter_problems(**params) + ([session_problem(session)] if session_problem(session) else [])
    if problems:
        raise SecAggError("; ".join(problems))
    result = SecureSumResult(session, cohort, threshold, degree, bits, bound, min_inputs)
    graph = neighbourhoods(cohort, degree, rng)
    run = SumRun(result, {**params, "deposit": deposit}, graph, timeout_s, peers, seen, active=set(cohort))
    try:
        for name, stage in zip(STAGES, (_advertise, _share, _mask, _unmask), strict=True):
            if on_round is not None:
                on_round(name)
            stage(transport, run)
    except Aborted as why:
        result.sum = result.sum_mod = None
        result.aborted = str(why)
    return result


# --- one round ------------------------------------------------------------------------------------
def _round(
    transport: Transport,
    run: SumRun,
    stage: str,
    payloads: dict[int, Any],
    reply_cls: type,
    expect: Callable[[int], dict[str, Any]],
) -> dict[int, Any]:
    """Send each node its payload; the well-formed, consenting replies by node. Every other node
    (no reply, an error, a refusal, a malformed reply) is a dropout of this round, with why."""
    message_type = {"advertise": ADVERTISE, "share": SHARE, "mask": MASK, "unmask": UNMASK}[stage]
    outgoing = [Outgoing(n, message_type, wire.encode(p)) for n, p in payloads.items()]
    start = time.perf_counter()
    kwargs = {} if run.timeout_s is None else {"timeout_s": run.timeout_s}
    exchange = exchange_in_chunks(transport, outgoing, **kwargs)
    run.result.seconds_by_stage[stage] = time.perf_counter() - start
    down, up = exchange.totals()
    run.result.bytes_by_stage[stage] = {"down": down, "up": up}
    replies, run.refusals = {}, {}
    for incoming in exchange.replies:
        node = incoming.node_id
        if incoming.content is None:
            run.drop(node, stage, incoming.error or "no reply")
            continue
        try:
            reply = wire.decode(reply_cls, incoming.content).decoded(**expect(node))
        except PayloadError as err:
            run.blame(node, stage, f"it answered malformed ({str(err)[:200]})")
            continue
        if reply.refused:
            run.drop(node, stage, (reply.reason or "refused")[:300])
            run.refusals[node] = reply
        else:
            replies[node] = reply
    run.active &= set(replies)
    return replies


def _keep_neighbourhoods(run: SumRun, stage: str) -> None:
    """Abort if fewer than t nodes are left; else drop the nodes with fewer than t - 1 neighbours
    left (their secrets could not be rebuilt, and they would refuse), until none is, and check again."""
    _enough_left(run, stage)
    while short := [u for u in run.active if len(run.graph[u] & run.active) + 1 < run.threshold]:
        for u in short:
            run.drop(u, stage, f"fewer than {run.threshold} of its neighbourhood left")
    _enough_left(run, stage)


def _enough_left(run: SumRun, stage: str) -> None:
    if len(run.active) < run.floor:
        raise Aborted(f"after round {stage!r} only {len(run.active)} nodes are left, below the floor {run.floor}")


# --- the four rounds ------------------------------------------------------------------------------
def _advertise(transport: Transport, run: SumRun) -> None:
    request = AdvertiseKeys(session=run.session, **run.params)
    replies = _round(transport, run, "advertise", dict.fromkeys(run.active, request), AdvertiseReply, lambda n: {})
    for node, reply in replies.items():
        keys = Advertised(*(_raw(getattr(reply, f)) for f in ("mask_key", "cipher_key", "identity", "signature")))
        problem = advertise_problem(node, run.session, keys, run.peers)
        if problem:
            run.blame(node, "advertise", problem)
        else:
            run.advertised[node] = keys
    _one_node_one_identity(run)
    _keep_neighbourhoods(run, "advertise")


def _raw(value: np.ndarray | None) -> bytes:
    return b"" if value is None else value.tobytes()


def _one_node_one_identity(run: SumRun) -> None:
    """Two node ids under one identity are one node posing as two (a sybil): both are named."""
    owners: dict[bytes, list[int]] = {}
    for node in sorted(run.active):
        if run.advertised[node].identity:
            owners.setdefault(run.advertised[node].identity, []).append(node)
    for nodes in owners.values():
        for node in nodes if len(nodes) > 1 else []:
            run.blame(node, "advertise", f"its identity is also node(s) {[n for n in nodes if n != node]}'s")


def _share(transport: Transport, run: SumRun) -> None:
    neighbours = {u: sorted(run.graph[u] & run.active) for u in run.active}
    payloads = {u: _share_keys(run, ns) for u, ns in neighbours.items()}
    replies = _round(transport, run, "share", payloads, ShareReply, lambda u: {"neighbours": set(neighbours[u])})
    _keep_neighbourhoods(run, "share")
    run.inbox = {v: [] for v in run.active}
    for sender in sorted(run.active):
        reply = replies[sender]
        run.commitments[sender] = reply.seed_commitment.tobytes()
        tokens = unpack_bytes(reply.ciphertexts, reply.lengths)
        for recipient, token in zip(reply.recipients.tolist(), tokens, strict=True):
            if recipient in run.active:  # a pair of nodes that both shared: each masks with the other
                run.inbox[recipient].append((sender, token))


def _share_keys(run: SumRun, neighbours: list[int]) -> ShareKeys:
    def table(field: str) -> np.ndarray:
        rows = [getattr(run.advertised[n], field) or bytes(PUBLIC_KEY_BYTES) for n in neighbours]
        return np.frombuffer(b"".join(rows), np.uint8).reshape(len(neighbours), -1)

    signatures, lengths = pack_bytes([run.advertised[n].signature for n in neighbours])
    return ShareKeys(
        run.session,
        node_ids(neighbours),
        table("mask_key"),
        table("cipher_key"),
        identities=table("identity"),
        signatures=signatures,
        signature_lengths=lengths,
    )


def _mask(transport: Transport, run: SumRun) -> None:
    payloads = {}
    for v in run.active:
        run.partners[v] = [u for u, _ in run.inbox[v]]
        flat, lengths = pack_bytes([token for _, token in run.inbox[v]])
        payloads[v] = MaskInput(run.session, node_ids(run.partners[v]), flat, lengths)
    expect = {"length": run.length, "bits": run.result.bits}
    replies = _round(transport, run, "mask", payloads, MaskedInput, lambda v: expect)
    _judge_blames(run)
    _no_replays(run, replies)
    if len(replies) < run.floor:
        raise Aborted(f"only {len(replies)} masked inputs arrived, below the floor {run.floor}: nothing is unmasked")
    run.total = np.zeros(run.length, np.uint64)
    for reply in replies.values():
        run.total += reply.masked.astype(np.uint64)  # wraps mod 2^64, a multiple of 2^bits
    run.result.survivors = sorted(replies)
    for v in run.result.survivors:  # every input's self mask needs t holders still in
        holders = 1 + len(set(run.partners[v]) & run.active)
        if holders < run.threshold:
            raise Aborted(f"the input of node {v} has {holders} holders left, below threshold {run.threshold}")


def _judge_blames(run: SumRun) -> None:
    """Each blamed peer judged once, on one accuser's proof (``secure_checks.blame_culprit``); any
    blame abandons the session: a proof opens one pair's ciphertexts, so nothing of it is unmasked."""
    judged: set[int] = set()
    for accuser in sorted(run.refusals):
        reply = run.refusals[accuser]
        if reply.blamed is None or reply.evidence is None or len(reply.blamed) != len(reply.evidence):
            continue
        for accused, proof in zip(reply.blamed.tolist(), reply.evidence, strict=True):
            if accused in judged or accuser in run.result.culprits:
                continue
            judged.add(accused)
            token = dict(run.inbox.get(accuser, [])).get(accused)
            culprit, why = blame_culprit(run.session, accuser, accused, proof.tobytes(), token, run.advertised)
            run.blame(culprit, "mask", why)
    if judged:
        raise Aborted(f"round 'mask': {len(judged)} peer(s) blamed; the session is abandoned, nothing is unmasked")


def _no_replays(run: SumRun, replies: dict[int, MaskedInput]) -> None:
    """A masked vector one of the caller's earlier sums already saw: masks are fresh per session, so
    only a replay repeats one. Its sender is named and is out of this sum (a dropout after sharing)."""
    if run.seen is None:
        return
    for node in sorted(replies):
        fingerprint = hashlib.sha256(replies[node].masked.tobytes()).digest()
        if fingerprint in run.seen:
            run.blame(node, "mask", "it replayed a masked vector of an earlier sum")
            del replies[node]
        else:
            run.seen.add(fingerprint)


def _unmask(transport: Transport, run: SumRun) -> None:
    survivors = set(run.result.survivors)
    lists = {v: (sorted(set(run.partners[v]) & survivors), sorted(set(run.partners[v]) - survivors)) for v in survivors}
    payloads = {v: Unmask(run.session, node_ids(alive), node_ids(gone)) for v, (alive, gone) in lists.items()}

    def expect(v: int) -> dict[str, set[int]]:
        return {"seed_owners": {v, *lists[v][0]}, "key_owners": set(lists[v][1])}

    replies = _round(transport, run, "unmask", payloads, UnmaskReply, expect)
    seed_shares, key_shares = collect_shares(replies)
    total = run.total
    for u in sorted(survivors):
        seed = _rebuild(run, u, seed_shares.get(u, []), "seed")
        total = total - self_mask(seed, run.length, run.result.bits, session=run.session)
    for u in sorted({u for alive, gone in lists.values() for u in gone}):
        total = _remove_pair_masks(run, total, u, key_shares.get(u, []), survivors)
    _reveal(run, total & modulus_mask(run.result.bits))


def _rebuild(run: SumRun, owner: int, shares: list[HeldShare], kind: str) -> bytes:
    """``owner``'s seed (checked against its commitment) or mask key (against its public key), from
    the holders' shares; culprits named on the way; Aborted if it cannot be rebuilt."""
    if kind == "seed":
        commitment = run.commitments.get(owner, b"")

        def sound(secret: bytes) -> bool:
            return seed_commitment(run.session, owner, secret) == commitment
    else:
        mask_key = run.mask_key(owner)

        def sound(secret: bytes) -> bool:
            try:
                return public_key_bytes(private_key_from(secret)) == mask_key
            except SecAggError:
                return False

    identity = run.advertised[owner].identity
    secret, culprits, why = rebuild(
        run.session, owner, shares, run.threshold, kind=kind, identity=identity, sound=sound
    )
    for node, what in culprits.items():
        run.result.culprits.setdefault(node, f"unmask: {what}")
    if secret is None:
        raise Aborted(f"{why}: nothing is unmasked")
    return secret


def _remove_pair_masks(
    run: SumRun, total: np.ndarray, u: int, shares: list[HeldShare], survivors: set[int]
) -> np.ndarray:
    """``total`` without the masks the survivors share with ``u``, which dropped after sharing: its
    mask key rebuilt from t shares (checked against its public key), each pair's key agreed again
    with the survivor's public key."""
    mask_sk = private_key_from(_rebuild(run, u, shares, "key"))
    for v in sorted(w for w in survivors if u in run.partners[w]):
        shared = generate_shared_key(mask_sk, public_key_from(run.mask_key(v)))
        mask = pair_mask(shared, run.length, run.result.bits, session=run.session, pair=(u, v))
        total = total - mask if pairwise_sign(v, u) > 0 else total + mask  # undo what v added
    return total


def _reveal(run: SumRun, residues: np.ndarray) -> None:
    """The sum, unless a coordinate lies outside ±n·bound: no n in-range inputs sum to that, so an
    input was out of range (a node that skipped its own check) and the sum is rejected."""
    signed = decode_signed(residues, run.result.bits)
    limit = len(run.result.survivors) * run.result.bound
    outside = np.flatnonzero((signed < -limit) | (signed > limit))
    if outside.size:
        run.result.out_of_range = True
        i = int(outside[0])
        raise Aborted(
            f"the unmasked sum is outside ±{limit} (= {len(run.result.survivors)} inputs × range {run.result.bound}) "
            f"at {outside.size} coordinate(s), e.g. coordinate {i} = {int(signed[i])}: an input was out of range "
            "(a node that skipped its own check); the sum is rejected"
        )
    run.result.sum, run.result.sum_mod = signed, residues
