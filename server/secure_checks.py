"""What the server checks in a secure sum so that a rogue peer is named instead of aborting the sum
for everyone (audit 4, item 10): its advertised keys, a blame one node lays on another, and the
shares that rebuild a secret.

Every check names a *culprit* only on evidence a rogue cannot forge against an honest node: a
signature the named node's identity made (or failed to make), or a Diffie-Hellman point proven to
be the accuser's (``common/secagg/proof.py``). A blame that does not hold names the accuser.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.fernet import InvalidToken
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt

from common.secagg import SecAggError, parse_share_plaintext, public_key_from, unpack_bytes
from common.secagg.identity import advertise_message, digest, share_message, verifies
from common.secagg.messages import UnmaskReply
from common.secagg.proof import pair_key, verified_shared_point
from common.secagg.shamir import combine_shares


@dataclass(frozen=True)
class Advertised:
    """What a node advertised in round 1: its two keys and, where it has one, its identity and
    signature."""

    mask_key: bytes
    cipher_key: bytes
    identity: bytes
    signature: bytes


def advertise_problem(node: int, session: str, keys: Advertised, peers: frozenset[bytes] | None) -> str:
    """Why ``node``'s advertise cannot be used ("" when it can): keys off the curve or equal, a
    signature its identity did not make for this session and node id, an identity the federation
    did not publish (``peers``, when the server has them), or none where ``peers`` requires one."""
    try:
        public_key_from(keys.mask_key)
        public_key_from(keys.cipher_key)
    except SecAggError as err:
        return f"its advertised keys are not keys: {err}"
    if keys.mask_key == keys.cipher_key:
        return "its two advertised keys are one key"
    if not keys.identity:
        return "it advertised no identity, and the federation's keys are published" if peers else ""
    if peers is not None and keys.identity not in peers:
        return "its identity is not among the federation's published keys"
    message = advertise_message(session, node, keys.mask_key, keys.cipher_key)
    if not verifies(keys.identity, keys.signature, message):
        return "its keys are not signed by its identity for this session (forged or replayed)"
    return ""


def blame_culprit(
    session: str,
    accuser: int,
    accused: int,
    proof: bytes,
    token: bytes | None,
    advertised: dict[int, Advertised],
) -> tuple[int, str]:
    """(the culprit, why) of ``accuser``'s blame of ``accused``: the accuser's proof opens the one
    ciphertext the accused sent it (``token``); garbage, another session or pair, or (both having
    identities) no valid signature by the accused: the accused. A proof that does not verify, a
    blame of a node that sent nothing, or a ciphertext that is fine: the accuser."""
    if token is None:
        return accuser, f"it blamed node {accused}, which sent it nothing"
    mine, theirs = advertised[accuser], advertised[accused]
    try:
        shared = verified_shared_point(proof, mine.cipher_key, theirs.cipher_key)
    except SecAggError as err:
        return accuser, f"its blame of node {accused} carries no valid proof ({err})"
    try:
        plaintext = decrypt(pair_key(shared), base64.urlsafe_b64encode(token))
        seed, key, signature = parse_share_plaintext(plaintext, session=session, src=accused, dst=accuser)
    except (InvalidToken, SecAggError, ValueError):
        return accused, f"its ciphertext to node {accuser} does not open to its shares (garbage or replayed)"
    if mine.identity and theirs.identity:
        message = share_message(session, accused, accuser, digest(seed), digest(key))
        if not verifies(theirs.identity, signature, message):
            return accused, f"its shares to node {accuser} carry no valid signature of its own"
    return accuser, f"it blamed node {accused}, whose ciphertext to it is sound"


@dataclass(frozen=True)
class HeldShare:
    """One holder's share of an owner's secret, as returned at round 4, with what checks it: the
    digest of the owner's other share to that holder and the owner's signature on both."""

    holder: int
    share: bytes
    other_digest: bytes
    signature: bytes


def rebuild(
    session: str,
    owner: int,
    shares: list[HeldShare],
    threshold: int,
    *,
    kind: str,
    identity: bytes,
    sound: Callable[[bytes], bool],
) -> tuple[bytes | None, dict[int, str], str]:
    """(the secret, culprits, why not) from ``shares`` of ``owner``'s ``kind`` ("seed" or "key").

    The first t shares are tried; a secret that is not ``sound`` (its commitment, its public key)
    sends the server to the signatures: a share its owner did not sign names its holder; if the
    shares the owner did sign still rebuild nothing sound, the owner signed inconsistent shares (or
    committed to another secret) and is named. Without an owner identity nothing can be attributed."""
    if len(shares) < threshold:
        return None, {}, f"the {kind} of node {owner} has {len(shares)} shares, below threshold {threshold}"
    secret = _combine(shares[:threshold])
    if secret is not None and sound(secret):
        return secret, {}, ""
    if not identity:
        return (
            None,
            {},
            f"the {kind} of node {owner} cannot be rebuilt from its shares (no identity to say whose fault)",
        )
    culprits, good = {}, []
    for held in shares:
        seed_digest, key_digest = (
            (digest(held.share), held.other_digest) if kind == "seed" else (held.other_digest, digest(held.share))
        )
        if verifies(identity, held.signature, share_message(session, owner, held.holder, seed_digest, key_digest)):
            good.append(held)
        else:
            culprits[held.holder] = f"it returned a share of node {owner}'s {kind} that node {owner} did not sign"
    secret = _combine(good[:threshold]) if len(good) >= threshold else None
    if secret is not None and sound(secret):
        return secret, culprits, ""
    if len(good) >= threshold:
        culprits[owner] = f"the shares of its {kind} it signed rebuild no {kind} it committed to"
        return None, culprits, f"node {owner} signed inconsistent shares of its {kind}"
    return None, culprits, f"the {kind} of node {owner} has {len(good)} sound shares, below threshold {threshold}"


def collect_shares(replies: dict[int, UnmaskReply]) -> tuple[dict[int, list[HeldShare]], dict[int, list[HeldShare]]]:
    """owner -> the shares of its seed, and of its mask key, that the holders sent (with what checks them)."""
    seeds: dict[int, list[HeldShare]] = {}
    keys: dict[int, list[HeldShare]] = {}
    for holder, reply in sorted(replies.items()):
        for owners, shares, flat, lengths, out in (
            (reply.seed_owners, reply.seed_shares, reply.seed_signatures, reply.seed_signature_lengths, seeds),
            (reply.key_owners, reply.key_shares, reply.key_signatures, reply.key_signature_lengths, keys),
        ):
            proofs = unpack_bytes(flat, lengths) if flat is not None else [b""] * owners.size
            for owner, row, proof in zip(owners.tolist(), shares, proofs, strict=True):
                out.setdefault(owner, []).append(HeldShare(holder, row.tobytes(), proof[:32], proof[32:]))
    return seeds, keys


SECRET_BYTES = 32  # a self-mask seed and a mask key's scalar alike


def _combine(shares: list[HeldShare]) -> bytes | None:
    try:
        return combine_shares([h.share for h in shares], SECRET_BYTES)
    except (ValueError, TypeError):
        return None
