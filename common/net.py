"""Network facts shared by the data plane's server (server/dataplane.py) and its node workers."""

from __future__ import annotations

import ipaddress

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
