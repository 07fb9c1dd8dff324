"""Network namespaces for ``fedgan deploy --local --netns``: every SuperNode on its own host.

Each SuperNode gets a namespace joined to this machine by a veth pair with its own /30 subnet, so
its traffic to the SuperLink crosses a real network interface with separate addresses instead of
loopback. Needs root and iproute2 (``available()`` says whether both are there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


class NetnsError(RuntimeError):
    """A namespace or veth pair could not be made (not root, no iproute2, name clash)."""


@dataclass(frozen=True)
class Host:
    name: str  # namespace name
    host_ip: str  # this machine's end of the veth pair (where the node connects to)
    node_ip: str  # the node's address inside its namespace


def available() -> bool:
    """Whether namespaces can be made here: root and the ``ip`` command."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


class Namespaces:
    """Creates hosts on demand; ``close()`` deletes exactly the namespaces it made."""

    def __init__(self) -> None:
        self.tag = f"fg{os.getpid() % 100000}"
        self.subnet = 20 + os.getpid() % 200  # second octet, so concurrent runs do not collide
        self.hosts: list[Host] = []

    def add(self) -> Host:
        i = len(self.hosts)
        if i > 250:
            raise NetnsError("at most 250 namespaced SuperNodes per deployment")
        host = Host(f"{self.tag}n{i}", f"10.{self.subnet}.{i}.1", f"10.{self.subnet}.{i}.2")
        outer, inner = f"{self.tag}h{i}", f"{self.tag}c{i}"
        _ip("netns", "add", host.name)
        self.hosts.append(host)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.name)
        _ip("addr", "add", f"{host.host_ip}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", host.name, "addr", "add", f"{host.node_ip}/30", "dev", inner)
        _ip("-n", host.name, "link", "set", inner, "up")
        _ip("-n", host.name, "link", "set", "lo", "up")
        return host

    @staticmethod
    def exec_prefix(host: Host) -> list[str]:
        return ["ip", "netns", "exec", host.name]

    def close(self) -> None:
        """Deleting a namespace deletes its end of the veth pair, and with it the pair."""
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True, timeout=30)
        self.hosts.clear()
