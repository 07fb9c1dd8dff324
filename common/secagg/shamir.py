"""Shamir secret sharing over the prime field GF(2^31 − 1), vectorised with NumPy.

Flower's ``create_shares``/``combine_shares`` (PyCryptodome's Shamir over GF(2^128), one 16-byte
block at a time, in pure Python) took 57 of 64 s of a 100-node sum's share round and 42 s of its
unmask round (``bench/secure_sum_cost.py``, complete graph). A node shares two 32-byte secrets with
up to c − 1 neighbours at threshold t: here both secrets are cut into 30-bit limbs (9 each, every
limb below p), and one Horner pass over the t coefficients evaluates all limbs at all n holders at
once, products below 2^62 in uint64. Reconstruction is Lagrange interpolation at 0.

Why this is Shamir's scheme, unchanged: each limb is the constant term of its own polynomial of
degree t − 1 whose other coefficients are drawn uniformly from the field (rejection sampling: no
bias), so any t − 1 shares are independent of the secret. The shares carry their holder's point
x = 1..n. DESIGN §8 asks for maintained crypto; this departs from it for the sharing only (key
agreement, encryption and signatures stay the ``cryptography`` package's), and the tests check it
against the scheme's defining properties (any t shares rebuild, t − 1 are uniform).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

P = (1 << 31) - 1  # a Mersenne prime: products of two elements fit in 62 bits
LIMB_BITS = 30  # every limb < 2^30 < p
_HEADER = 4  # a share starts with its holder's point x, uint32 little-endian


def _limbs(secret: bytes) -> np.ndarray:
    """The secret as base-2^30 limbs, least significant first (its length is fixed by the caller)."""
    value, count = int.from_bytes(secret, "little"), -(-len(secret) * 8 // LIMB_BITS)
    return np.array([(value >> (LIMB_BITS * i)) & ((1 << LIMB_BITS) - 1) for i in range(count)], np.uint64)


def _from_limbs(limbs: np.ndarray, size: int) -> bytes:
    value = sum(int(v) << (LIMB_BITS * i) for i, v in enumerate(limbs.tolist()))
    if value >> (8 * size):
        raise ValueError("the shares rebuild a value wider than the secret")
    return value.to_bytes(size, "little")


def uniform(shape: tuple[int, ...]) -> np.ndarray:
    """Field elements drawn uniformly from [0, p) by rejection (31 random bits; p itself is redrawn)."""
    count = int(np.prod(shape))
    out = np.frombuffer(os.urandom(4 * count), np.uint32) & np.uint32(P)
    while (bad := np.flatnonzero(out == P)).size:
        out = out.copy()
        out[bad] = np.frombuffer(os.urandom(4 * bad.size), np.uint32) & np.uint32(P)
    return out.astype(np.uint64).reshape(shape)


def create_shares(secret: bytes, threshold: int, holders: int) -> list[bytes]:
    """``holders`` shares of ``secret``, any ``threshold`` of which rebuild it; share i belongs to
    holder point x = i + 1."""
    if not 1 <= threshold <= holders < P:
        raise ValueError(f"a threshold of {threshold} for {holders} holders")
    limbs = _limbs(secret)
    coefficients = uniform((threshold, limbs.size))
    coefficients[0] = limbs
    x = np.arange(1, holders + 1, dtype=np.uint64)[:, None]
    acc = np.zeros((holders, limbs.size), np.uint64)
    for row in coefficients[::-1]:  # Horner: acc·x + a_k, every product < 2^62
        acc = (acc * x + row) % P
    header = np.arange(1, holders + 1, dtype="<u4")[:, None].view(np.uint8)
    body = acc.astype("<u4").view(np.uint8)
    return [bytes(h) + bytes(b) for h, b in zip(header, body, strict=True)]


def combine_shares(shares: Sequence[bytes], size: int) -> bytes:
    """The ``size``-byte secret the shares rebuild (Lagrange interpolation at 0); ValueError for
    shares that are malformed, of unequal length, at a repeated point or off the field."""
    if not shares or len({len(s) for s in shares}) != 1 or (len(shares[0]) - _HEADER) % 4:
        raise ValueError("shares of unequal or malformed length")
    rows = np.frombuffer(b"".join(shares), "<u4").reshape(len(shares), -1).astype(np.uint64)
    xs, ys = rows[:, 0].tolist(), rows[:, 1:]
    if len(set(xs)) != len(xs) or 0 in xs or (ys >= P).any():
        raise ValueError("shares at a repeated or zero point, or off the field")
    lagrange = np.array([_lagrange_at_zero(i, xs) for i in range(len(xs))], np.uint64)
    limbs = ((lagrange[:, None] * ys) % P).sum(axis=0) % P  # t terms below 2^31 each: no overflow
    return _from_limbs(limbs, size)


def _lagrange_at_zero(i: int, xs: list[int]) -> int:
    """Π_{j≠i} x_j / (x_j − x_i) mod p."""
    num, den = 1, 1
    for j, xj in enumerate(xs):
        if j != i:
            num, den = num * xj % P, den * (xj - xs[i]) % P
    return num * pow(den, -1, P) % P
