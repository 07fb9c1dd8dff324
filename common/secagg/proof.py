"""A blame the server can check without learning more than one pair's key: a DLEQ proof on P-256.

When node v cannot use what peer u sent it (a ciphertext that does not decrypt, shares whose
signature fails), v names u. A rogue must not be able to name an honest node, and v must not
reveal its whole session key (every node a rogue sent garbage to would, and the server could then
open every share of the session). So v reveals only the pair's Diffie-Hellman point S = sk_v·U (U:
u's public cipher key) with a Chaum-Pedersen proof that log_G(V) = log_U(S) (V: v's public cipher
key, which v signed at advertise). The server checks the proof, derives the pair's key from S
exactly as Flower's ``generate_shared_key`` does, and opens the one ciphertext u sent v: if it is
garbage, u is the rogue; if it is fine, v lied. What S opens is one pair's messages of a session
the server then abandons.

The curve arithmetic is plain Python (Jacobian coordinates): a proof costs a few milliseconds, and
is only made when a peer is blamed. The ``cryptography`` package gives the keys' coordinates.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg import CURVE, SecAggError

P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)
PROOF_BYTES = 33 + 32 + 32  # S compressed, the challenge c, the response z
Point = tuple[int, int] | None  # affine; None is the point at infinity


# --- the curve ------------------------------------------------------------------------------------
def _to_jacobian(p: Point) -> tuple[int, int, int]:
    return (1, 1, 0) if p is None else (p[0], p[1], 1)


def _from_jacobian(p: tuple[int, int, int]) -> Point:
    x, y, z = p
    if z == 0:
        return None
    zi = pow(z, -1, P)
    return (x * zi * zi % P, y * zi * zi * zi % P)


def _double(p: tuple[int, int, int]) -> tuple[int, int, int]:
    x, y, z = p
    if z == 0 or y == 0:
        return (1, 1, 0)
    yy = y * y % P
    s = 4 * x * yy % P
    m = (3 * x * x + A * pow(z, 4, P)) % P
    nx = (m * m - 2 * s) % P
    return (nx, (m * (s - nx) - 8 * yy * yy) % P, 2 * y * z % P)


def _add(p: tuple[int, int, int], q: tuple[int, int, int]) -> tuple[int, int, int]:
    if p[2] == 0:
        return q
    if q[2] == 0:
        return p
    z1z1, z2z2 = p[2] * p[2] % P, q[2] * q[2] % P
    u1, u2 = p[0] * z2z2 % P, q[0] * z1z1 % P
    s1, s2 = p[1] * q[2] * z2z2 % P, q[1] * p[2] * z1z1 % P
    if u1 == u2:
        return _double(p) if s1 == s2 else (1, 1, 0)
    h, r = (u2 - u1) % P, (s2 - s1) % P
    hh = h * h % P
    hhh = h * hh % P
    v = u1 * hh % P
    nx = (r * r - hhh - 2 * v) % P
    return (nx, (r * (v - nx) - s1 * hhh) % P, h * p[2] * q[2] % P)


def mul(k: int, p: Point) -> Point:
    """k·p (double and add)."""
    acc, base = (1, 1, 0), _to_jacobian(p)
    for bit in bin(k % N)[2:]:
        acc = _double(acc)
        if bit == "1":
            acc = _add(acc, base)
    return _from_jacobian(acc)


def add(p: Point, q: Point) -> Point:
    return _from_jacobian(_add(_to_jacobian(p), _to_jacobian(q)))


def neg(p: Point) -> Point:
    return None if p is None else (p[0], (-p[1]) % P)


def on_curve(p: Point) -> bool:
    return p is not None and (p[1] * p[1] - p[0] ** 3 - A * p[0] - B) % P == 0


def point(encoded: bytes) -> Point:
    """An encoded public key (X9.62) as a point; SecAggError if it is not one of the curve."""
    try:
        numbers = ec.EllipticCurvePublicKey.from_encoded_point(CURVE, bytes(encoded)).public_numbers()
    except ValueError as err:
        raise SecAggError(f"not a point of {CURVE.name}: {err}") from err
    return (numbers.x, numbers.y)


def compressed(p: Point) -> bytes:
    if p is None:
        raise SecAggError("the point at infinity has no encoding")
    return bytes([2 + (p[1] & 1)]) + p[0].to_bytes(32, "big")


# --- the proof ------------------------------------------------------------------------------------
def _challenge(*points: Point) -> int:
    data = b"fedgan-secagg-dleq|" + b"".join(compressed(p) for p in points)
    return int.from_bytes(hashlib.sha256(data).digest(), "big") % N


def prove_shared_point(private: ec.EllipticCurvePrivateKey, peer_public: bytes) -> bytes:
    """S = sk·U and a proof that S and the prover's public key share the discrete log sk."""
    sk, U = private.private_numbers().private_value, point(peer_public)
    V, S = mul(sk, G), mul(sk, U)
    r = secrets.randbelow(N - 1) + 1
    c = _challenge(G, V, U, S, mul(r, G), mul(r, U))
    z = (r + c * sk) % N
    return compressed(S) + c.to_bytes(32, "big") + z.to_bytes(32, "big")


def verified_shared_point(proof: bytes, prover_public: bytes, peer_public: bytes) -> Point:
    """The pair's point S if ``proof`` shows it is sk·U for the sk behind ``prover_public``;
    SecAggError otherwise."""
    if len(proof) != PROOF_BYTES:
        raise SecAggError(f"a blame's proof of {len(proof)} bytes (expected {PROOF_BYTES})")
    S, V, U = point(proof[:33]), point(prover_public), point(peer_public)
    c, z = int.from_bytes(proof[33:65], "big"), int.from_bytes(proof[65:], "big")
    if not (0 < z < N and 0 <= c < N and on_curve(S)):
        raise SecAggError("a blame's proof out of range")
    a = add(mul(z, G), neg(mul(c, V)))  # z·G − c·V = r·G
    b = add(mul(z, U), neg(mul(c, S)))  # z·U − c·S = r·U
    if a is None or b is None or _challenge(G, V, U, S, a, b) != c:
        raise SecAggError("a blame's proof does not verify")
    return S


def pair_key(shared: Point) -> bytes:
    """The Fernet key Flower's ``generate_shared_key`` derives from the pair's point (its x)."""
    x = shared[0].to_bytes(32, "big")
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=None).derive(x)
    return base64.urlsafe_b64encode(derived)
