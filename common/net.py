"""Network facts shared by the data plane's server (server/dataplane.py) and its node workers."""

from __future__ import annotations

import ipaddress

MAX_GRPC_MESSAGE = 256 * 1024 * 1024  # gRPC's 4 MiB default is below a paper-model query


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or a name) stays on this machine: plaintext is allowed only there."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
