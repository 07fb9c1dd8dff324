"""Who a secure sum's peers are: each node's identity key, and the federation's published keys.

A node only checked the cohort size and threshold the server *declared*, so a server could fill a
"cohort of 10" with keys of its own and unmask one node's deposit (audit 4, item 3). As in Bell et
al.'s malicious-server variant, each node now signs what it advertises (its two fresh SecAgg keys,
bound to the session and its node id) with a long-lived identity key, and checks every peer's
signature against the keys the federation published, which reach it through its own configuration,
never through the server. The same keys sign the shares a node hands each neighbour, so a share that
does not rebuild its owner's secret names who lied (the owner, or the holder that altered it).

Where they live: the node's identity in ``secagg-identity-<client>.pem`` and the published keys in
``secagg-peers.json``, both in the node's own root (its ``state-dir``) unless its node config names
other files (``secagg-identity``, ``secagg-peers``). The operator of a federation provisions them
(``provision``; ``fedgan deploy --local`` does). A simulation's nodes share one root, and a secure
run of 10^5 simulated nodes should not write 10^5 key files: there the operator keeps one secret
(``secagg-simulated-identities.key``) from which each simulated node derives its own key
(``provision_simulated``), as ``fedgan simulate`` does for secure runs. A node without an identity
verifies nobody: it may still join sums, but its policy's ``trust-secure-sum`` is refused
(``client/node.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from common.secagg import CURVE, PUBLIC_KEY_BYTES, SecAggError, public_key_bytes, public_key_from, session_digest

PEERS_FORMAT = "fedgan.secagg_peers/1"
PEERS_FILE = "secagg-peers.json"
SIMULATED_FILE = "secagg-simulated-identities.key"
ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # of P-256's base point
SIGNATURE_BYTES = 64  # an ECDSA P-256 signature as r ‖ s
MAX_PEERS_BYTES = 64 << 20  # 100,000 nodes' keys as hex are ~7 MB


def identity_path(root: str | Path, client_id: int) -> Path:
    return Path(root) / f"secagg-identity-{client_id:05d}.pem"


def peers_path(root: str | Path) -> Path:
    return Path(root) / PEERS_FILE


# --- the operator's side ------------------------------------------------------------------------
def provision(roots: Mapping[int, str | Path]) -> None:
    """Give every client of ``roots`` (client id -> its node's root) an identity key where it has
    none, and write the federation's published keys (all of them) into every root. Idempotent: an
    existing identity is kept, so a node's identity survives runs."""
    keys = {}
    for client_id, root in roots.items():
        path = identity_path(root, client_id)
        if not path.is_file():
            _write_private(path, ec.generate_private_key(CURVE))
        keys[client_id] = public_key_bytes(load_identity(path))
    text = json.dumps({"format": PEERS_FORMAT, "keys": sorted(k.hex() for k in keys.values())})
    for root in {str(r) for r in roots.values()}:
        _write_atomic(peers_path(root), text)


def provision_simulated(root: str | Path, num_clients: int) -> frozenset[bytes]:
    """A simulation's identities: one secret in ``root`` (made once), each simulated client's key
    derived from it, and the published keys of all ``num_clients`` written beside it. Returns them."""
    secret_file = Path(root) / SIMULATED_FILE
    if not secret_file.is_file():
        _write_secret(secret_file, os.urandom(32))
    secret = secret_file.read_bytes()
    keys = sorted(public_key_bytes(simulated_identity(secret, cid)).hex() for cid in range(num_clients))
    _write_atomic(peers_path(root), json.dumps({"format": PEERS_FORMAT, "keys": keys}))
    return frozenset(bytes.fromhex(k) for k in keys)


def simulated_identity(secret: bytes, client_id: int) -> ec.EllipticCurvePrivateKey:
    """Simulated client ``client_id``'s identity key, derived from the simulation's secret."""
    if len(secret) != 32:
        raise SecAggError(f"a simulation's identity secret is 32 bytes, got {len(secret)}")
    digest_ = hashlib.sha256(b"fedgan-secagg-identity|" + secret + client_id.to_bytes(8, "little")).digest()
    return ec.derive_private_key(int.from_bytes(digest_, "big") % (ORDER - 1) + 1, CURVE)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_secret(path, pem)


def _write_secret(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the node's side ------------------------------------------------------------------------------
def load_identity(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """A node's identity key (PEM, P-256); SecAggError naming the file when it is not one."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise SecAggError(f"secure-aggregation identity key {path} cannot be read: {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != CURVE.name:
        raise SecAggError(f"secure-aggregation identity key {path} is not a {CURVE.name} key")
    return key


def load_peers(path: str | Path) -> frozenset[bytes]:
    """The federation's published identity keys (compressed points); SecAggError naming the file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_PEERS_BYTES:
            raise ValueError(f"{path.stat().st_size:,} bytes (at most {MAX_PEERS_BYTES:,})")
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != PEERS_FORMAT:
            raise ValueError(f"not a peers file (format {PEERS_FORMAT!r})")
        keys = frozenset(bytes.fromhex(k) for k in data["keys"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SecAggError(f"the federation's published keys {path} cannot be read: {err}") from err
    if any(len(k) != PUBLIC_KEY_BYTES for k in keys):
        raise SecAggError(f"the federation's published keys {path} hold a key that is not {PUBLIC_KEY_BYTES} bytes")
    return keys


# --- what is signed -------------------------------------------------------------------------------
def advertise_message(session: str, node: int, mask_key: bytes, cipher_key: bytes) -> bytes:
    """What a node signs in round 1: its two fresh keys, for this session, as this node id."""
    return b"fedgan-secagg-advertise|" + session_digest(session) + node.to_bytes(8, "little") + mask_key + cipher_key


def share_message(session: str, owner: int, holder: int, seed_digest: bytes, key_digest: bytes) -> bytes:
    """What an owner signs for each holder in round 2: the digests (``digest``) of the two shares it
    hands that holder. A holder later returns one share, the other's digest and this signature, so
    the server checks the share without seeing the other."""
    ids = owner.to_bytes(8, "little") + holder.to_bytes(8, "little")
    return b"fedgan-secagg-share|" + session_digest(session) + ids + seed_digest + key_digest


def digest(share: bytes) -> bytes:
    return hashlib.sha256(b"fedgan-secagg-share-digest|" + share).digest()


def seed_commitment(session: str, owner: int, seed: bytes) -> bytes:
    """What an owner commits its self-mask seed to in round 2 (the server checks a rebuilt seed)."""
    return hashlib.sha256(
        b"fedgan-secagg-seed|" + session_digest(session) + owner.to_bytes(8, "little") + seed
    ).digest()


def sign(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    """ECDSA over SHA-256 as r ‖ s, 32 bytes each: a fixed size (DER's 70 to 72 bytes made a secure
    run's byte counts differ from run to run, so a deployment's could not equal the simulation's)."""
    r, s = decode_dss_signature(key.sign(message, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def verifies(identity: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` (r ‖ s) is ``identity``'s on ``message`` (False for a malformed key or
    signature)."""
    if len(signature) != SIGNATURE_BYTES:
        return False
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    try:
        public_key_from(bytes(identity)).verify(der, message, ec.ECDSA(hashes.SHA256()))
    except (SecAggError, ValueError, InvalidSignature):
        return False
    return True


def distinct(keys: Iterable[bytes]) -> bool:
    keys = list(keys)
    return len(set(keys)) == len(keys)
