"""Network namespaces for ``fedgan deploy --local --netns``: every SuperNode on a host of its own.

The machine plays the server host: a bridge holds its address on a private /24 (``server_ip``,
``10.S.0.1``), and each SuperNode gets a namespace plugged into that bridge by a veth pair, with its
own address (``10.S.0.2``, ``.3``, ...) and a default route through the server. So, as on a LAN,
every node dials the SuperLink and the data plane at the one server address, which is not loopback,
and the server sees each node's connections come from that node's address. Needs root and iproute2
(``available()`` says whether both are there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

MAX_NODES = 250  # addresses .2 to .251 of the /24


class NetnsError(RuntimeError):
    """A namespace, bridge or veth pair could not be made (not root, no iproute2, name clash)."""


@dataclass(frozen=True)
class Host:
    name: str  # namespace name
    host_ip: str  # the server host's address on the bridge (where the node connects to)
    node_ip: str  # the node's own address inside its namespace


def available() -> bool:
    """Whether namespaces can be made here: root and the ``ip`` command."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


class Namespaces:
    """The server's bridge, made by ``open()``, and hosts on demand; ``close()`` deletes exactly
    the namespaces and the bridge it made."""

    def __init__(self) -> None:
        self.tag = f"fg{os.getpid() % 100000}"
        self.subnet = 20 + os.getpid() % 200  # second octet, so concurrent runs do not collide
        self.bridge = f"{self.tag}br"
        self.server_ip = f"10.{self.subnet}.0.1"
        self.hosts: list[Host] = []
        self._bridge_made = False

    def open(self) -> str:
        """The bridge holding the server's address (made once); returns that address."""
        if not self._bridge_made:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("addr", "add", f"{self.server_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        return self.server_ip

    def add(self) -> Host:
        self.open()
        i = len(self.hosts)
        if i >= MAX_NODES:
            raise NetnsError(f"at most {MAX_NODES} namespaced SuperNodes per deployment")
        host = Host(f"{self.tag}n{i}", self.server_ip, f"10.{self.subnet}.0.{i + 2}")
        outer, inner = f"{self.tag}h{i}", f"{self.tag}c{i}"
        _ip("netns", "add", host.name)
        self.hosts.append(host)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.name)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", host.name, "addr", "add", f"{host.node_ip}/24", "dev", inner)
        _ip("-n", host.name, "link", "set", inner, "up")
        _ip("-n", host.name, "link", "set", "lo", "up")
        _ip("-n", host.name, "route", "add", "default", "via", self.server_ip)
        return host

    @staticmethod
    def exec_prefix(host: Host) -> list[str]:
        return ["ip", "netns", "exec", host.name]

    def close(self) -> None:
        """Deleting a namespace deletes its end of the veth pair, and with it the pair; then the bridge."""
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True, timeout=30)
        self.hosts.clear()
        if self._bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
            self._bridge_made = False
