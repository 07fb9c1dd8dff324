"""Keys and certificates for ``fedgan deploy --tls --auth``: a private CA, the SuperLink's server
certificate, and one EC key pair per SuperNode (OpenSSH format, as ``flwr supernode register`` and
``flower-supernode --auth-supernode-private-key`` expect).

Made with ``cryptography`` (a Flower dependency) so no openssl binary is needed; the compose
deployment's ``deploy/certs/generate.sh`` makes the same kind of files with openssl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.io.net import is_host, shown_address

VALID_DAYS = 30


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    private_key: Path
    public_key: Path


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_tls(folder: Path, *, hosts: list[str]) -> TlsFiles:
    """A fresh CA and a SuperLink certificate valid for ``hosts`` (names or IP addresses)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedgan deployment CA"))
        .issuer_name(_name("fedgan deployment CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("superlink"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    files = TlsFiles(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.server_key,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return files


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_node_key(folder: Path, name: str) -> NodeKey:
    """An EC (NIST P-384) key pair for SuperNode authentication, in OpenSSH format."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    files = NodeKey(folder / name, folder / f"{name}.pub")
    _write_private(
        files.private_key,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    files.public_key.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return files


# ---- files for a deployment across hosts ----------------------------------------------------------
SERVER_FOLDER = "server"
SERVER_HOLDS = "the TLS private key of the SuperLink and the data plane (server.key)"
NODE_HOLDS = "this SuperNode's private key (SuperNode authentication)"
# Named too, so the same files serve docker-compose.server.yml (its services dial these names).
COMPOSE_SERVICES = ("superlink", "serverapp")
# A key pair and a folder each (a few ms): far above any deployment; 10^9 had made 321 MB in 4 minutes.
MAX_NODES = 10_000


def server_host_problem(host: str) -> str:
    """Why ``host`` cannot be named in the server's certificate ("" when it can): an IP address, or a
    DNS name of dot-separated labels (at most 63 characters each, 253 in all). A malformed name gave a
    certificate no node could verify, found only when the deployment failed to connect."""
    if not host.endswith(".") and is_host(host, underscores=False):  # a certificate names no trailing dot
        return ""
    shown = shown_address(host)
    return (
        f"invalid --server-host {shown!r}: give an IP address or a DNS name (letters, digits and inner hyphens, "
        "dot-separated labels of at most 63 characters)"
    )


def check_request(server_hosts: list[str], num_nodes: int) -> None:
    """The server's names and the number of SuperNodes, checked before any file is made (a ValueError
    naming the flag)."""
    if not 1 <= num_nodes <= MAX_NODES:
        raise ValueError(f"invalid --num-nodes {num_nodes}: must be between 1 and {MAX_NODES:,}")
    if not server_hosts:
        raise ValueError("need the server's address (--server-host)")
    problem = next((p for p in map(server_host_problem, server_hosts) if p), "")
    if problem:
        raise ValueError(problem)


def check_new_folder(folder: Path) -> None:
    """``folder`` is absent or an empty directory, and takes files (made if missing): checked with a real
    write, since root ignores permission bits and only a write tells a read-only mount. A ValueError
    naming it (FileExistsError when it holds something: nothing in it is replaced)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is not a directory: choose a new folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty; choose a new folder (nothing in it was replaced)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".pki-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"cannot write to --out {folder} ({err.strerror or err}): choose a writable folder") from None


def make_hosts(folder: Path, *, server_hosts: list[str], num_nodes: int) -> dict[str, list[Path]]:
    """One folder per host of a deployment across hosts, holding exactly what that host needs:

    ``server/``: ca.crt, server.pem and server.key (SuperLink and data plane; the certificate names
    ``server_hosts``, the addresses or names the nodes dial, localhost for ``flwr`` there, and the
    compose services superlink and serverapp) and
    every ``supernode-<i>.pub`` to register; ``supernode-<i>/``: ca.crt and that node's private key.
    Folders holding a private key get a DO_NOT_PUBLISH.txt. Existing files are never replaced.
    """
    from common.io.private_paths import mark_private

    check_request(server_hosts, num_nodes)
    check_new_folder(folder)
    server = folder / SERVER_FOLDER
    mark_private(server, SERVER_HOLDS)
    tls = make_tls(server, hosts=list(dict.fromkeys([*server_hosts, *COMPOSE_SERVICES, "localhost", "127.0.0.1"])))
    layout = {SERVER_FOLDER: [tls.ca_cert, tls.server_cert, tls.server_key]}
    for i in range(1, num_nodes + 1):
        name = f"supernode-{i}"
        node = folder / name
        mark_private(node, NODE_HOLDS)
        key = make_node_key(node, name)
        public = key.public_key.rename(server / key.public_key.name)  # only the server needs it
        (node / tls.ca_cert.name).write_bytes(tls.ca_cert.read_bytes())
        layout[name] = [node / tls.ca_cert.name, key.private_key]
        layout[SERVER_FOLDER].append(public)
    return layout


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m simulations.deploy.pki",
        description="Make the CA, the server certificate and the SuperNode keys of a deployment across "
        "hosts, one folder per host (copy each to its host; see docs/deployment/hosts.md).",
    )
    parser.add_argument("--out", type=Path, required=True, help="a new (or empty) folder this process can write")
    parser.add_argument(
        "--server-host",
        action="append",
        required=True,
        help="IP address or DNS name the SuperNodes dial the server host at, named in its certificate "
        "(repeat for several)",
    )
    parser.add_argument(
        "--num-nodes",
        type=int,
        required=True,
        help=f"SuperNodes (supernode-1 ... supernode-N), at most {MAX_NODES:,}: one key pair and folder each",
    )
    args = parser.parse_args(argv)
    try:
        layout = make_hosts(args.out, server_hosts=args.server_host, num_nodes=args.num_nodes)
    except (ValueError, FileExistsError) as err:
        parser.error(str(err))
    except OSError as err:  # a write that failed after the checks (a full disk): which file, and why
        parser.error(f"cannot write {err.filename or args.out} ({err.strerror or err}); the files made so far stay")
    for host, files in layout.items():
        print(f"{args.out / host}/  -> the {host} host: " + ", ".join(f.name for f in files))


if __name__ == "__main__":
    main()
