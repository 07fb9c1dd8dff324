"""SecAgg+ (Bell et al. 2020) arithmetic shared by the server's driver and the nodes: no flwr here.

What the two sides must agree on bit for bit lives in this module: the modulus (``required_bits``),
the parameters a node accepts (``parameter_problems``), the neighbour graph (``neighbourhoods``),
the masks (``expand_mask``: AES-256-CTR keystream reduced mod 2^b, uniform because 2^b divides 2^64;
Flower's ``pseudo_rand_gen`` is not used: it folds its seed to 32 bits and draws from [0, range-1)),
the sign of a pairwise mask, the EC key encodings and the plaintext of an encrypted share. The
cryptographic primitives (ECDH + HKDF key agreement, Fernet, Shamir) are Flower's; the shells call
them (``client/secure_sum.py``, ``server/secure_sum.py``). The protocol and its threat model are
described in docs/secure-aggregation.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import re
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

CURVE = ec.SECP256R1()  # 128-bit security, like the AES keys; Flower's own workflow uses P-384
PUBLIC_KEY_BYTES = 33  # X9.62 compressed point
PRIVATE_KEY_BYTES = 32  # the private scalar, big-endian: what is Shamir-shared (48 bytes once padded)
SEED_BYTES = 32  # the self-mask seed: an AES-256 key
MAX_BITS = 64  # masks and sums are uint64 arithmetic, reduced mod 2^b
MAX_LENGTH = 1 << 26  # coordinates per vector a node accepts to mask (512 MiB of uint64)
SESSION_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
NODE_IDS = np.dtype("<u8")  # Flower's node ids are 64-bit unsigned


class SecAggError(ValueError):
    """A SecAgg+ message or parameter that cannot be used; the message names the cause."""


# --- parameters ---------------------------------------------------------------------------------
def required_bits(cohort: int, bound: int) -> int:
    """The smallest modulus bits b with b >= ceil(log2(2·c·R + 1)) + 1.

    Inputs are integers in [-R, R], so a sum of at most c of them lies in [-cR, cR]: 2cR + 1 values,
    which ceil(log2(2cR + 1)) bits hold without wrapping (``(2cR).bit_length()`` is exactly that).
    The one bit more leaves as many residues outside [-cR, cR] as inside, so a rogue input that
    pushes the sum out of range is seen by the server (``decode_signed`` and its range check)."""
    return (2 * cohort * bound).bit_length() + 1


def mask_dtype(bits: int) -> np.dtype:
    """The narrowest unsigned dtype holding b bits: what a masked vector travels as."""
    for dtype in ("<u1", "<u2", "<u4", "<u8"):
        if bits <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    raise SecAggError(f"{bits} modulus bits exceed the {MAX_BITS}-bit arithmetic")


def complete_degree(cohort: int) -> int:
    """The degree of the complete graph: every client is every other's neighbour."""
    return cohort - 1


def sparse_degree(cohort: int) -> int:
    """Bell et al.'s k ≈ 2·log2(c) (even, for the ring construction), or complete when not smaller."""
    k = 2 * math.ceil(math.log2(max(cohort, 2)))
    return k if k < cohort - 1 else complete_degree(cohort)


def fewest_inputs(threshold: int, min_inputs: int) -> int:
    """The fewest inputs a revealed sum may hold: ``min_inputs`` when declared (0: the threshold).
    With the complete graph the two coincide; with a sparse one the threshold is a neighbourhood's,
    and the floor on the sum (what distributed noise is calibrated for) is declared on its own."""
    return max(threshold, min_inputs)


def majority_threshold(degree: int) -> int:
    """The smallest threshold a node accepts for a neighbourhood of degree + 1 (see ``parameter_problems``)."""
    return (degree + 1) // 2 + 1


def parameter_problems(
    *, cohort: int, threshold: int, degree: int, bits: int, bound: int, length: int, min_inputs: int = 0
) -> list[str]:
    """Why a node will not run a sum with these parameters (empty: it will).

    The threshold t must be a strict majority of a neighbourhood (its degree + 1 holders): each
    node gives the server, for a neighbour, either its self-mask share (it survived) or its key
    share (it dropped), never both, so with 2t > k + 1 no two disjoint sets of holders can hand a
    server both secrets of one client."""
    out = []
    if cohort < 2:
        out.append(f"a cohort of {cohort} is no aggregate")
    if not (0 < degree <= cohort - 1) or (degree < cohort - 1 and degree % 2):
        out.append(f"degree {degree} is neither the complete graph ({cohort - 1}) nor an even k below it")
    if not (majority_threshold(degree) <= threshold <= degree + 1):
        out.append(
            f"threshold {threshold} is not a strict majority of a neighbourhood of {degree + 1} "
            f"(needs {majority_threshold(degree)} to {degree + 1})"
        )
    if min_inputs and not (threshold <= min_inputs <= cohort):
        out.append(f"a revealed sum's fewest inputs {min_inputs} must be in [threshold {threshold}, cohort {cohort}]")
    if bound < 1:
        out.append(f"the per-coordinate range {bound} must be >= 1")
    elif not (required_bits(cohort, bound) <= bits <= MAX_BITS):
        out.append(
            f"{bits} modulus bits cannot hold a sum of {cohort} inputs in [-{bound}, {bound}] without wrapping "
            f"(needs {required_bits(cohort, bound)} to {MAX_BITS})"
        )
    if not (0 < length <= MAX_LENGTH):
        out.append(f"a vector of {length} coordinates (1 to {MAX_LENGTH})")
    return out


COMPLETE_UP_TO = 40  # cohorts up to this size use the complete graph by default (Shamir is O(c·t) per node)


def cohort_graph(size: int, degree: int, fewest: int) -> tuple[int, int]:
    """(degree, secret-sharing threshold) of a cohort of ``size`` whose sums hold at least ``fewest``
    inputs. ``degree`` 0: the complete graph up to ``COMPLETE_UP_TO``, else Bell et al.'s sparse k.
    The complete graph shares with max(fewest, a majority); a sparse one with a strict majority of
    each neighbourhood (the floor on the sum is then declared apart, ``fewest_inputs``)."""
    complete = complete_degree(size)
    if degree:
        degree = complete if degree >= complete else degree + degree % 2
    else:
        degree = complete if size <= COMPLETE_UP_TO else sparse_degree(size)
    if degree == complete:
        return degree, min(size, max(majority_threshold(degree), fewest))
    return degree, majority_threshold(degree)


def split_cohorts(nodes: Sequence[int], cohort: int, rng: np.random.Generator) -> list[list[int]]:
    """``nodes`` split at random into max(1, n // c) cohorts of c to 2c - 1 (near-equal sizes)."""
    if not nodes:
        return []
    order = [nodes[i] for i in rng.permutation(len(nodes))]
    count = max(1, len(order) // cohort)
    bounds = np.linspace(0, len(order), count + 1).round().astype(int)  # node ids are 64-bit unsigned
    return [sorted(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def session_problem(session: str) -> str:
    """Why ``session`` is not a usable session id ("")."""
    return "" if SESSION_PATTERN.match(session) else f"session id {session[:80]!r} is not 1-64 of [A-Za-z0-9_.:-]"


def new_session() -> str:
    """A fresh session id (random: two sums never share one)."""
    return "s" + secrets.token_hex(12)


# --- the neighbour graph ------------------------------------------------------------------------
def neighbourhoods(nodes: Sequence[int], degree: int, rng: secrets.SystemRandom | None = None) -> dict[int, set[int]]:
    """Each node's neighbours (itself excluded): the complete graph, or Bell et al.'s random k-regular
    ring (a random order, each node joined to the k/2 before and after it)."""
    nodes = list(nodes)
    if degree >= len(nodes) - 1:
        return {u: set(nodes) - {u} for u in nodes}
    (rng or secrets.SystemRandom()).shuffle(nodes)
    half, n = degree // 2, len(nodes)
    return {u: {nodes[(i + o) % n] for o in range(-half, half + 1) if o} for i, u in enumerate(nodes)}


# --- masks --------------------------------------------------------------------------------------
def expand_mask(key: bytes, length: int, bits: int, *, session: str, purpose: str) -> np.ndarray:
    """``length`` values uniform mod 2^bits (uint64) from AES-256-CTR under ``key``.

    The keystream's 64-bit words are uniform mod 2^64, and 2^bits divides 2^64, so the low ``bits``
    are exactly uniform. The counter block is bound to the session and the mask's purpose, so a key
    reused by mistake in another session or role still gives another stream."""
    if len(key) != 32:
        raise SecAggError(f"a mask key must be 32 bytes, got {len(key)}")
    nonce = hashlib.sha256(f"fedgan-secagg|{session}|{purpose}".encode()).digest()[:16]
    stream = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(bytes(8 * length))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64) & modulus_mask(bits)


def self_mask(seed: bytes, length: int, bits: int, *, session: str) -> np.ndarray:
    """A node's self mask, from its seed (reconstructed by the server only if its input is in the sum)."""
    return expand_mask(seed, length, bits, session=session, purpose="self")


def pair_mask(shared_key: bytes, length: int, bits: int, *, session: str, pair: tuple[int, int]) -> np.ndarray:
    """The mask two nodes share, from the key Flower's ``generate_shared_key`` gave them (base64 of
    the 32-byte HKDF output); both ends derive the same stream, whichever computes it."""
    a, b = sorted(pair)
    key = base64.urlsafe_b64decode(shared_key)
    return expand_mask(key, length, bits, session=session, purpose=f"pair:{a}:{b}")


def modulus_mask(bits: int) -> np.uint64:
    """2^bits - 1 as a uint64: ``x & modulus_mask(b)`` is x mod 2^b."""
    return np.uint64((1 << bits) - 1)


def pairwise_sign(own: int, other: int) -> int:
    """+1 if ``own`` adds the pair's mask, -1 if it subtracts it: the smaller node id adds, so the
    two masks cancel in the sum."""
    return 1 if own < other else -1


def encode_inputs(vector: np.ndarray) -> np.ndarray:
    """Signed integers as uint64 residues mod 2^64 (two's complement): reduced mod 2^b later."""
    return np.asarray(vector, dtype=np.int64).astype(np.uint64)


def decode_signed(residues: np.ndarray, bits: int) -> np.ndarray:
    """Residues mod 2^b as the signed integers in [-2^(b-1), 2^(b-1)) they stand for."""
    values = residues.astype(np.uint64) & modulus_mask(bits)
    if bits == MAX_BITS:
        return values.view(np.int64)
    half = np.uint64(1 << (bits - 1))
    return values.astype(np.int64) - np.where(values >= half, np.int64(1 << bits), np.int64(0))


@dataclass(frozen=True)
class DepositTerms:
    """What a deposit's noise share was calibrated for, kept on the node with the deposit: a sum it
    joins must reveal at least ``floor`` inputs (the survivors whose shares carry the charged noise),
    sum integers in ±``bound`` (what the modulus and the server's range check are sized for) and
    ``length`` coordinates. A server declaring anything else is refused before keys are made."""

    floor: int
    bound: int
    length: int

    def problems(self, *, floor: int, bound: int, length: int) -> list[str]:
        """Why a sum declared with these parameters is not the one this deposit was made for."""
        out = []
        if floor < self.floor:
            out.append(
                f"a revealed sum of {floor} inputs is below the {self.floor} survivors this node's noise share "
                "was calibrated for"
            )
        if bound != self.bound:
            out.append(f"the declared range ±{bound} is not the range ±{self.bound} of this node's deposit")
        if length != self.length:
            out.append(f"a sum of {length} coordinates, but this node deposited {self.length}")
        return out


def input_problem(vector: np.ndarray, *, bound: int, length: int) -> str:
    """Why a node's own input cannot be masked (""): not ``length`` integers in [-bound, bound]. The
    sentence names how many coordinates are out of range, never their values (the input is noisy
    but private: a refusal travels to the server)."""
    vector = np.asarray(vector)
    if vector.shape != (length,):
        return f"the input has shape {vector.shape}, the sum is of {length} coordinates"
    if vector.dtype.kind not in "iu":
        return f"the input has dtype {vector.dtype}; the sum is of integers"
    wide = vector.astype(np.int64 if vector.dtype.kind == "i" else np.uint64)  # compared without overflow
    low = wide < -bound if vector.dtype.kind == "i" else np.zeros(vector.shape, bool)
    outside = np.flatnonzero(low | (wide > bound))
    if len(outside):
        return f"{len(outside)} coordinate(s) outside the range ±{bound}; refused before masking"
    return ""


# --- keys and shares ----------------------------------------------------------------------------
def new_private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVE)


def public_key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)


def public_key_from(data: bytes) -> ec.EllipticCurvePublicKey:
    """A neighbour's public key; SecAggError if it is not a point of the curve. Decoded once per key
    (a compressed point costs a square root, 40 µs: a 100-node sum decoded its keys 70,000 times)."""
    return _decoded(bytes(data))


@functools.lru_cache(maxsize=1 << 14)
def _decoded(data: bytes) -> ec.EllipticCurvePublicKey:
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(CURVE, data)
    except ValueError as err:
        raise SecAggError(f"not a public key on {CURVE.name}: {err}") from err


def private_key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_numbers().private_value.to_bytes(PRIVATE_KEY_BYTES, "big")


def private_key_from(data: bytes) -> ec.EllipticCurvePrivateKey:
    """A private key from its scalar (a node's own, or one the server reconstructed)."""
    try:
        return ec.derive_private_key(int.from_bytes(data, "big"), CURVE)
    except ValueError as err:
        raise SecAggError(f"not a private key on {CURVE.name}: {err}") from err


_SHARE_HEADER = struct.Struct("<16sQQHHH")  # session digest, src, dst, seed-share, key-share, signature lengths


def share_plaintext(
    session: str, src: int, dst: int, seed_share: bytes, key_share: bytes, signature: bytes = b""
) -> bytes:
    """What ``src`` encrypts for ``dst``: its shares, bound to the session and to both ends (the
    receiver checks all three, so a server cannot replay a share elsewhere), and ``src``'s signature
    on them where it has an identity (so a holder cannot alter a share unnoticed)."""
    lengths = (len(seed_share), len(key_share), len(signature))
    return _SHARE_HEADER.pack(session_digest(session), src, dst, *lengths) + seed_share + key_share + signature


def parse_share_plaintext(plaintext: bytes, *, session: str, src: int, dst: int) -> tuple[bytes, bytes, bytes]:
    """(seed share, key share, the owner's signature or b"") from a decrypted plaintext; SecAggError
    if it is not for this session and pair."""
    if len(plaintext) < _SHARE_HEADER.size:
        raise SecAggError("a share plaintext shorter than its header")
    digest, got_src, got_dst, n_seed, n_key, n_sig = _SHARE_HEADER.unpack_from(plaintext)
    if (digest, got_src, got_dst) != (session_digest(session), src, dst):
        raise SecAggError(f"a share from {src} to {dst} names another session or pair")
    body = plaintext[_SHARE_HEADER.size :]
    if len(body) != n_seed + n_key + n_sig:
        raise SecAggError("a share plaintext whose lengths do not add up")
    return body[:n_seed], body[n_seed : n_seed + n_key], body[n_seed + n_key :]


def session_digest(session: str) -> bytes:
    return hashlib.sha256(f"fedgan-secagg-session|{session}".encode()).digest()[:16]


# --- lists of byte strings on the wire ----------------------------------------------------------
def pack_bytes(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings as one flat uint8 array and their lengths (the wire carries arrays, not lists)."""
    flat = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
    return flat, np.array([len(b) for b in items], dtype="<u4")


def unpack_bytes(flat: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """The byte strings ``pack_bytes`` packed; SecAggError when the lengths do not cover ``flat``."""
    if flat.ndim != 1 or lengths.ndim != 1 or int(lengths.astype(np.int64).sum()) != flat.size:
        raise SecAggError(f"{lengths.size} lengths summing to {int(lengths.sum())} for {flat.size} bytes")
    data, out, at = flat.astype(np.uint8).tobytes(), [], 0
    for n in lengths.tolist():
        out.append(data[at : at + n])
        at += n
    return out


def node_ids(ids: Sequence[int]) -> np.ndarray:
    return np.array(list(ids), dtype=NODE_IDS)
