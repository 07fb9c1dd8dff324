"""The four rounds of a secure sum (SecAgg+, ``common/secagg.py``): requests and replies.

Flower's message types are ``<category>.<identifier>``, so the rounds are ``query.secagg_advertise``,
``query.secagg_share``, ``query.secagg_mask`` and ``query.secagg_unmask``. Node ids travel as uint64
arrays, keys and shares as uint8 arrays (lists of byte strings as a flat array plus lengths). Every
reply may be a refusal (``refused``, ``reason``) and then carries nothing else, except a mask round's
blame (the peers whose shares this node could not use, each with the pair's Diffie-Hellman point
and a proof of it, ``common/secagg/proof.py``: the evidence the server checks). A reply's
``decoded(**expect)`` checks it against what the server sent (shapes, dtypes, the modulus), so the
driver only ever handles well-formed values; a node that answers malformed is named. Identities
and signatures (``common/secagg/identity.py``) are empty arrays where a node has no identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.io.codec import PayloadError
from common.secagg import NODE_IDS, PUBLIC_KEY_BYTES, mask_dtype, modulus_mask
from common.secagg.proof import PROOF_BYTES

COMMITMENT_BYTES = 32
SIGNATURE_BYTES = 64  # r ‖ s (``common/secagg/identity.py``)

ADVERTISE = "query.secagg_advertise"
SHARE = "query.secagg_share"
MASK = "query.secagg_mask"
UNMASK = "query.secagg_unmask"


def _carries(reply: object, *fields: str) -> None:
    """A reply that is no refusal must carry ``fields``: PayloadError naming those it lacks."""
    missing = [f for f in fields if getattr(reply, f) is None]
    _check(reply.refused or not missing, f"{type(reply).__name__} lacks {', '.join(missing)}")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise PayloadError(what)


@dataclass
class AdvertiseKeys:
    """Server -> each member of a cohort: a sum of ``length`` integers in [-bound, bound] over
    ``cohort`` nodes, mod 2^``bits``, neighbourhoods of ``degree`` + 1 (``cohort`` - 1: the complete
    graph), shares reconstructed from ``threshold`` holders, and no sum revealed of fewer than
    ``min_inputs`` inputs (0: the threshold). The node checks all of it against its policy and the
    protocol's rules before it makes keys."""

    session: str
    cohort: int
    threshold: int
    degree: int
    bits: int
    bound: int
    length: int
    min_inputs: int = 0
    deposit: str = ""  # the deposit this sum sums ("": the session's own name); a re-formed sum reuses it


@dataclass
class AdvertiseReply:
    """The node's two fresh public keys (masks, and the encryption of its shares) and, where it has
    an identity, that identity's public key and its signature on both keys for this session."""

    refused: bool
    reason: str
    mask_key: np.ndarray | None = None
    cipher_key: np.ndarray | None = None
    identity: np.ndarray | None = None  # uint8 (33,) or (0,)
    signature: np.ndarray | None = None  # uint8, DER; (0,) without an identity

    def decoded(self) -> AdvertiseReply:
        _carries(self, "mask_key", "cipher_key")
        for key in (self.mask_key, self.cipher_key):
            _check(key is None or (key.dtype == np.uint8 and key.shape == (PUBLIC_KEY_BYTES,)), "a malformed key")
        for field, sizes in (("identity", (0, PUBLIC_KEY_BYTES)), ("signature", (0, SIGNATURE_BYTES))):
            value = getattr(self, field)
            _check(
                value is None or (value.dtype == np.uint8 and value.ndim == 1 and value.size in sizes),
                f"a malformed {field}",
            )
        return self


@dataclass
class ShareKeys:
    """Server -> each node still in: its neighbours still in and their public keys (rows in the
    order of ``neighbours``)."""

    session: str
    neighbours: np.ndarray  # uint64 node ids
    mask_keys: np.ndarray  # uint8 (n, 33)
    cipher_keys: np.ndarray  # uint8 (n, 33)
    identities: np.ndarray | None = None  # uint8 (n, 33); a row of zeros: that neighbour has no identity
    signatures: np.ndarray | None = None  # uint8, flat: each neighbour's advertise signature
    signature_lengths: np.ndarray | None = None  # uint32, one per neighbour


@dataclass
class ShareReply:
    """One ciphertext per neighbour (to ``recipients``): the node's shares of its self-mask seed and
    of its mask key, encrypted for that neighbour alone."""

    refused: bool
    reason: str
    recipients: np.ndarray | None = None  # uint64
    ciphertexts: np.ndarray | None = None  # uint8, flat
    lengths: np.ndarray | None = None  # uint32, one per recipient
    seed_commitment: np.ndarray | None = None  # uint8 (32,): what its self-mask seed must rebuild to

    def decoded(self, *, neighbours: set[int]) -> ShareReply:
        _carries(self, "recipients", "ciphertexts", "lengths", "seed_commitment")
        if self.refused:
            return self
        _check(self.recipients.dtype == NODE_IDS and self.lengths.size == self.recipients.size, "malformed recipients")
        _check(set(self.recipients.tolist()) == neighbours, "ciphertexts for other nodes than its neighbours")
        _check(self.recipients.size == len(neighbours), "two ciphertexts for one neighbour")
        _check(int(self.lengths.astype(np.int64).sum()) == self.ciphertexts.size, "lengths do not cover the bytes")
        c = self.seed_commitment
        _check(c.dtype == np.uint8 and c.shape == (COMMITMENT_BYTES,), "a malformed seed commitment")
        return self


@dataclass
class MaskInput:
    """Server -> each node that shared: the ciphertexts its neighbours made for it (from ``senders``);
    it masks its deposited input with its self mask and one pairwise mask per sender."""

    session: str
    senders: np.ndarray  # uint64
    ciphertexts: np.ndarray  # uint8, flat
    lengths: np.ndarray  # uint32


@dataclass
class MaskedInput:
    """The node's input plus its masks, mod 2^b (the narrowest unsigned dtype holding b bits)."""

    refused: bool
    reason: str
    masked: np.ndarray | None = None
    blamed: np.ndarray | None = None  # uint64: with a refusal, the senders whose shares it could not use
    evidence: np.ndarray | None = None  # uint8 (blamed, 97): per blamed peer, the pair's point and its proof

    def decoded(self, *, length: int, bits: int) -> MaskedInput:
        _carries(self, "masked")
        if self.refused:
            blamed, evidence = self.blamed, self.evidence
            _check(blamed is None or (blamed.dtype == NODE_IDS and blamed.ndim == 1), "malformed blamed ids")
            shape = (0 if blamed is None else blamed.size, PROOF_BYTES)
            _check(evidence is None or (evidence.dtype == np.uint8 and evidence.shape == shape), "malformed proofs")
            return self
        m = self.masked
        _check(m.dtype == mask_dtype(bits) and m.shape == (length,), f"a masked vector of {m.dtype} {m.shape}")
        _check(not m.size or int(m.max()) <= int(modulus_mask(bits)), f"a masked value beyond 2^{bits}")
        return self


@dataclass
class Unmask:
    """Server -> each node whose masked input arrived: which of its neighbours' inputs are in the
    sum (send their self-mask shares) and which dropped after sharing (send their key shares)."""

    session: str
    survivors: np.ndarray  # uint64, the node itself not included
    dropped: np.ndarray  # uint64


@dataclass
class UnmaskReply:
    """Shares (rows) of the self-mask seeds of ``seed_owners`` and of the mask keys of ``key_owners``."""

    refused: bool
    reason: str
    seed_owners: np.ndarray | None = None
    seed_shares: np.ndarray | None = None  # uint8 (n, share bytes)
    key_owners: np.ndarray | None = None
    key_shares: np.ndarray | None = None
    # per share row: the digest of the owner's other share to this holder (32 bytes), then the owner's
    # signature on both digests (``common/secagg_identity.share_message``; none where it has no identity)
    seed_signatures: np.ndarray | None = None
    seed_signature_lengths: np.ndarray | None = None
    key_signatures: np.ndarray | None = None
    key_signature_lengths: np.ndarray | None = None

    def decoded(self, *, seed_owners: set[int], key_owners: set[int]) -> UnmaskReply:
        _carries(self, "seed_owners", "seed_shares", "key_owners", "key_shares")
        if self.refused:
            return self
        for owners, shares, asked in (
            (self.seed_owners, self.seed_shares, seed_owners),
            (self.key_owners, self.key_shares, key_owners),
        ):
            _check(owners.dtype == NODE_IDS and shares.dtype == np.uint8, "malformed owners or shares")
            _check(shares.ndim == 2 and shares.shape[0] == owners.size, "one share row per owner")
            _check(set(owners.tolist()) == asked and owners.size == len(asked), "shares of other nodes than asked")
        for flat, lengths, owners in (
            (self.seed_signatures, self.seed_signature_lengths, self.seed_owners),
            (self.key_signatures, self.key_signature_lengths, self.key_owners),
        ):
            if flat is None and lengths is None:
                continue
            _check(flat is not None and lengths is not None, "signatures without their lengths")
            _check(flat.dtype == np.uint8 and lengths.size == owners.size, "one signature per share")
            _check(int(lengths.astype(np.int64).sum()) == flat.size, "signature lengths do not cover the bytes")
        return self


SECAGG = {
    ADVERTISE: (AdvertiseKeys, AdvertiseReply),
    SHARE: (ShareKeys, ShareReply),
    MASK: (MaskInput, MaskedInput),
    UNMASK: (Unmask, UnmaskReply),
}
