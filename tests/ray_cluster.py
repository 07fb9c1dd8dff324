"""A private Ray cluster of two nodes on this machine, for tests of ``--ray-address``.

Started with the ``ray`` CLI as a user would (``ray start --head``, then ``ray start --address``),
each node with one CPU and ports of its own (workers bind random ports), in a temp dir of its own
(short: Ray's socket paths must fit 107 bytes), so that it cannot meet another Ray instance on the
machine. Both ``ray start`` run with ``--block`` in sessions of their own, so the whole cluster is
their descendants and is stopped by exactly those processes, never by ``ray stop`` (which ends every
Ray process on the machine).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from simulations.deploy.processes import spawn, terminate
from simulations.experiments.ray_cluster import RayClusterError, probe

RAY = Path(sys.executable).parent / "ray"
START_TIMEOUT_S = 90.0
SECOND_NODE = "fedgan_second_node"  # a custom resource only the second node has


@dataclass
class RayCluster:
    address: str  # the head's GCS, HOST:PORT
    base: Path  # $RAY_TMPDIR of the cluster: ``ray start --head`` records itself in base/ray/
    started: list = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted(self.base.glob("*.log")))


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _node_ports(ports: list[int]) -> list[str]:
    names = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port")
    names += ("--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    return [arg for name, port in zip(names, ports, strict=True) for arg in (name, str(port))]


def _start(cluster: RayCluster, name: str, args: list[str], env: dict[str, str]) -> None:
    common = ["--block", "--num-cpus", "1", "--temp-dir", str(cluster.base / "ray"), "--disable-usage-stats"]
    common += ["--object-store-memory", str(80 * 2**20)]
    proc = spawn([str(RAY), "start", *args, *common], log=cluster.base / f"{name}.log", env=env)
    cluster.started.append(proc)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _wait_for(cluster: RayCluster, port: int, nodes: int) -> None:
    """Until the node just started listens on ``port`` and the cluster counts ``nodes`` live nodes
    (a cheap connect first: each probe of the cluster starts a Python process)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in cluster.started):
            pytest.skip(f"Ray cannot start a node here (`ray start` exited):\n{cluster.logs()}")
        if _listening(port):
            try:
                if len(probe(cluster.address, timeout_s=30)) == nodes:
                    return
            except RayClusterError:
                pass
        time.sleep(0.3)
    pytest.skip(f"Ray did not start {nodes} nodes here within {START_TIMEOUT_S:g} s:\n{cluster.logs()}")


@contextmanager
def two_node_cluster() -> Iterator[RayCluster]:
    """A head and a second node, one CPU each (the second with the ``SECOND_NODE`` resource); stopped
    on leaving, whatever happened. Skips the test, with the reason, where Ray cannot start two nodes."""
    if not RAY.is_file():
        pytest.skip(f"no ray CLI at {RAY}")
    base = Path(tempfile.mkdtemp(prefix="fgray", dir="/tmp"))
    ports = _free_ports(15)
    # Like another machine's, the nodes know nothing of this process's FEDGAN_* settings (a node's
    # place and policy): a run must hand them to its actors itself.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("FEDGAN_")}
    env.update(RAY_TMPDIR=str(base), RAY_DISABLE_USAGE_STATS="1")
    cluster = RayCluster(address=f"127.0.0.1:{ports[0]}", base=base)
    try:
        head = ["--head", "--port", str(ports[0]), "--include-dashboard", "false"]
        head += ["--ray-client-server-port", str(ports[1]), "--dashboard-port", str(ports[2])]
        _start(cluster, "head", head + _node_ports(ports[3:9]), env)
        _wait_for(cluster, ports[0], 1)
        second = ["--address", cluster.address, "--resources", f'{{"{SECOND_NODE}": 1}}']
        _start(cluster, "second", second + _node_ports(ports[9:15]), env)
        _wait_for(cluster, ports[9], 2)  # its node manager's port
        yield cluster
    finally:
        terminate(cluster.started, grace_s=10)
        shutil.rmtree(base, ignore_errors=True)
