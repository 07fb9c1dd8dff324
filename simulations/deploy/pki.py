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
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


def make_hosts(folder: Path, *, server_hosts: list[str], num_nodes: int) -> dict[str, list[Path]]:
    """One folder per host of a deployment across hosts, holding exactly what that host needs:

    ``server/``: ca.crt, server.pem and server.key (SuperLink and data plane; the certificate names
    ``server_hosts``, the addresses or names the nodes dial, localhost for ``flwr`` there, and the
    compose services superlink and serverapp) and
    every ``supernode-<i>.pub`` to register; ``supernode-<i>/``: ca.crt and that node's private key.
    Folders holding a private key get a DO_NOT_PUBLISH.txt. Existing files are never replaced.
    """
    from common.private_paths import mark_private

    if num_nodes < 1 or not server_hosts:
        raise ValueError("need at least one SuperNode and the server's address (--server-host)")
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty; choose a new folder (nothing in it was replaced)")
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
        "hosts, one folder per host (copy each to its host; see the README's 'Across hosts').",
    )
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    parser.add_argument(
        "--server-host",
        action="append",
        required=True,
        help="address or DNS name the SuperNodes dial the server host at (repeat for several)",
    )
    parser.add_argument("--num-nodes", type=int, required=True, help="SuperNodes (supernode-1 ... supernode-N)")
    args = parser.parse_args(argv)
    try:
        layout = make_hosts(args.out, server_hosts=args.server_host, num_nodes=args.num_nodes)
    except (ValueError, FileExistsError) as err:
        parser.error(str(err))
    for host, files in layout.items():
        print(f"{args.out / host}/  -> the {host} host: " + ", ".join(f.name for f in files))


if __name__ == "__main__":
    main()
