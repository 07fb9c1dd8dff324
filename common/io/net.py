"""Network facts shared by the data plane's server (server/dataplane.py) and its node workers."""

from __future__ import annotations

import ipaddress
import re

MAX_GRPC_MESSAGE = 256 * 1024 * 1024  # gRPC's 4 MiB default is below a paper-model query
# A data-plane worker sends its replies in fragments of at most this many content bytes, so that
# the server's one receive limit can stay at 1 MiB.
REPLY_FRAGMENT = 512 * 1024
# The call metadata key of a data-plane worker's Hello (serialized; "-bin": gRPC carries it as bytes).
# In the metadata, the server checks the token before the stream takes a thread or a byte of memory.
HELLO_METADATA_KEY = "fedgan-hello-bin"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or a name) stays on this machine: plaintext is allowed only there."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


MAX_RAY_ADDRESS_CHARS = 300  # a DNS name's 253 characters, brackets and a port: anything longer is no address
# One label of a host name: letters, digits, inner hyphens (and underscores, as container names have).
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_CERTIFICATE_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # RFC 1123: what a certificate names


def ray_address_problem(address: str) -> str:
    """Why ``address`` is no ``ray_address`` (""): empty, ``auto`` or the cluster's GCS as HOST:PORT, HOST an
    IP address or a DNS name. Ray Client addresses (ray://) are refused: the simulation's driver must join
    the cluster itself."""
    if address in ("", "auto"):
        return ""
    if len(address) > MAX_RAY_ADDRESS_CHARS:
        return f"longer than any HOST:PORT (at most {MAX_RAY_ADDRESS_CHARS} characters)"
    if "://" in address:
        return (
            "Ray Client (ray://) is not supported: run fedgan on a machine of the cluster and give the GCS "
            "address HOST:PORT that `ray start --head` printed (or auto)"
        )
    host, _, port = address.rpartition(":")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535 or not is_host(host.strip("[]")):
        return (
            "expected empty (a local Ray instance), auto, or HOST:PORT of the cluster's GCS (e.g. 10.0.0.5:6379), "
            "HOST an IP address or a DNS name and PORT in [1, 65535]"
        )
    return ""


def is_host(host: str, *, underscores: bool = True) -> bool:
    """Whether ``host`` is an IP address or a DNS name (dot-separated labels of at most 63 characters,
    253 in all): anything else only fails later, in the resolver, with a message naming no option.
    ``underscores``: allowed in labels, as container names have them; a name a certificate must
    verify has none (RFC 1123)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host.removesuffix(".")
    label = _HOST_LABEL if underscores else _CERTIFICATE_LABEL
    return 0 < len(name) <= 253 and all(label.fullmatch(part) for part in name.split("."))


def shown_address(address: str, limit: int = 60) -> str:
    """``address`` as an error message quotes it: cut to ``limit`` characters, so that a pasted file
    does not bury the message."""
    return address if len(address) <= limit else f"{address[:limit]}... ({len(address):,} characters)"
