"""``fedgan deploy --local``: the experiment as a real Flower deployment on this machine.

A SuperLink and one SuperNode per client run as separate processes on free loopback ports (or,
with ``--netns``, each SuperNode in its own network namespace, the SuperLink and the data plane
listening on the server's address on their bridge, as across hosts), with a private FLWR_HOME; the run is
submitted with ``flwr run`` and followed with ``flwr list``, and only a ``finished:completed`` status
counts as success (``flwr run`` exits 0 even when the ServerApp fails). ``--tls`` makes a CA and
runs every connection over TLS; ``--auth`` registers one key per SuperNode and turns on SuperNode
authentication. Every process started here is stopped here, whatever happens.

Each SuperNode reaches the SuperLink through a counting relay (``wire_relay``), so the report
(``run.py``, which submits and follows the run) holds three figures for the same traffic: the
payload our codec counts (equal to the simulation's), Flower's own per-run counters (``flwr list``:
protobuf messages), and the bytes on the wire (HTTP and TLS included, idle polls too).

The processes themselves start and stop here (``LocalDeployment``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.worker import PRIVATE_NETWORK_KEY
from common.io.private_paths import CLIENT_STATE, mark_private
from common.secagg.identity import provision

from . import netns, pki
from .processes import spawn, terminate
from .wire_relay import WireRelay

ROOT = Path(__file__).resolve().parents[2]
CONNECTION = "fedgan-local"
FINISHED = "finished:"


# What deploy/'s private folders hold (each gets a DO_NOT_PUBLISH.txt saying so).
NODE_DISKS = "each SuperNode's own disk (nodes/<i>/state/): " + CLIENT_STATE
NODE_KEYS = "the SuperNodes' private keys (SuperNode authentication)"
CA_KEYS = "the private keys of this deployment's certificate authority and of its servers (TLS)"


class DeployError(RuntimeError):
    """The deployment could not start, or Flower's CLI answered something unexpected."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def flwr_json(args: tuple[str, ...] | list[str], *, env: dict[str, str], timeout: float = 120) -> Any:
    """Run Flower's CLI (``--format json``) and return its answer; DeployError when it printed no JSON
    or said ``success: false`` (it exits 0 on some failures, such as an unreachable SuperLink)."""
    result = subprocess.run(["flwr", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = result.stdout
    try:
        answer = json.loads(out[out.index("{") :])
    except ValueError as err:
        raise DeployError(
            f"`flwr {' '.join(args)}` gave no JSON (exit {result.returncode}):\n{out[-2000:]}{result.stderr[-2000:]}"
        ) from err
    if not answer.get("success", False):
        raise DeployError(f"`flwr {' '.join(args)}` failed: {answer.get('error-message', answer)}")
    return answer


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    """Until ``host:port`` accepts connections; fails early, with the log's tail, if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeployError(f"{Path(proc.args[0]).name} exited with {proc.returncode}:\n{tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise DeployError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s:\n{tail(log)}")


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {log})"


def check_options(*, tls: bool, auth: bool, use_netns: bool) -> None:
    """Options that cannot work together or here; raised before any process starts."""
    if auth and not tls:
        raise DeployError("--auth needs --tls: Flower authenticates SuperNodes over TLS only")
    if use_netns and not netns.available():
        raise DeployError("--netns needs root and iproute2's `ip` command")


@dataclass
class Node:
    index: int
    proc: subprocess.Popen
    log: Path
    relay: WireRelay
    host: netns.Host | None = None


@dataclass
class LocalDeployment:
    """A SuperLink and ``num_nodes`` SuperNodes as local processes; a context manager.

    ``workdir`` receives FLWR_HOME, logs, certificates and keys, and each node's own disk
    (``nodes/<i>/``: its private discriminator state, as ``state-dir`` in its node config).
    """

    workdir: Path
    num_nodes: int
    tls: bool = False
    auth: bool = False
    use_netns: bool = False
    node_policy: Path | None = None  # every SuperNode's privacy policy file (node config privacy-policy)
    nodes: list[Node] = field(default_factory=list)
    started: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.port = free_port()
        self.dataplane_port = free_port()  # the ServerApp's gRPC data plane, fixed so nodes can be told
        self.namespaces = netns.Namespaces() if self.use_netns else None
        # Where the SuperLink and the data plane listen: loopback, or the server's address on the
        # namespaces' bridge (not loopback: what SuperNodes on other hosts dial).
        self.server_host = "127.0.0.1"
        self.tls_files: pki.TlsFiles | None = None
        self.env = dict(
            os.environ,
            FLWR_HOME=str(self.home),
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        check_options(tls=self.tls, auth=self.auth, use_netns=self.use_netns)
        for folder in (self.home, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        mark_private(self.workdir / "nodes", NODE_DISKS)
        if self.namespaces is not None:
            self.server_host = self.namespaces.open()
        hosts = [self.namespaces.add() for _ in range(self.num_nodes)] if self.namespaces else []
        if self.tls:
            mark_private(self.workdir / "certs", CA_KEYS)  # before the keys exist
            self.tls_files = pki.make_tls(
                self.workdir / "certs", hosts=sorted({"localhost", "127.0.0.1", self.server_host})
            )
        self._start_superlink()
        self._write_flwr_config()
        keys = self._register_keys() if self.auth else [None] * self.num_nodes
        # each node's secure-aggregation identity in its own state, the published keys in every one
        provision({i: self.workdir / "nodes" / str(i) / "state" for i in range(self.num_nodes)})
        for i in range(self.num_nodes):
            self.nodes.append(self.start_supernode(i, key=keys[i], host=hosts[i] if hosts else None))

    def _start_superlink(self) -> None:
        args = ["flower-superlink", "--host", self.server_host, "--port", str(self.port)]
        args.append("--disable-runtime-dependency-installation")
        args += self._server_tls_args()
        if self.auth:
            args.append("--enable-supernode-auth")
        log = self.logs / "superlink.log"
        proc = spawn(args, log=log, env=self.env)
        self.started.append(proc)
        wait_for_port(self.server_host, self.port, 60, proc, log)

    def _server_tls_args(self) -> list[str]:
        if self.tls_files is None:
            return ["--insecure"]
        return [
            "--ssl-ca-certfile",
            str(self.tls_files.ca_cert),
            "--ssl-certfile",
            str(self.tls_files.server_cert),
            "--ssl-keyfile",
            str(self.tls_files.server_key),
        ]

    def _client_tls_args(self) -> list[str]:
        return ["--insecure"] if self.tls_files is None else ["--root-certificates", str(self.tls_files.ca_cert)]

    def _write_flwr_config(self) -> None:
        lines = [
            f'[superlink]\ndefault = "{CONNECTION}"\n',
            f"[superlink.{CONNECTION}]",
            f'address = "{self.server_host}:{self.port}"',
        ]
        lines.append("insecure = true" if self.tls_files is None else f'root-certificates = "{self.tls_files.ca_cert}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def _register_keys(self) -> list[pki.NodeKey]:
        mark_private(self.workdir / "keys", NODE_KEYS)
        keys = []
        for i in range(self.num_nodes):
            key = pki.make_node_key(self.workdir / "keys", f"supernode-{i}")
            self.flwr("supernode", "register", str(key.public_key), CONNECTION, "--format", "json")
            keys.append(key)
        return keys

    def start_supernode(
        self,
        index: int,
        *,
        key: pki.NodeKey | None = None,
        host: netns.Host | None = None,
        partition: int | None = None,
        name: str | None = None,
    ) -> Node:
        """One SuperNode holding partition ``index`` (or ``partition``), behind its own relay."""
        partition = index if partition is None else partition
        relay = WireRelay(host.host_ip if host else "127.0.0.1", (self.server_host, self.port))
        state_dir = self.workdir / "nodes" / str(index) / "state"
        mark_private(state_dir, CLIENT_STATE)
        node_config = f"partition-id={partition} num-partitions={self.num_nodes} state-dir='{state_dir}'"
        if self.node_policy is not None:
            node_config += f" privacy-policy='{self.node_policy}'"
        if host is not None and self.tls_files is None:
            # The bridge joins only this machine and its namespaces: the node allows a plaintext data
            # plane there, as a compose network's nodes do (beyond one machine, use --tls).
            node_config += f" {PRIVATE_NETWORK_KEY}=true"
        args = [
            "flower-supernode",
            "--superlink",
            f"{relay.address[0]}:{relay.address[1]}",
            "--port",
            str(free_port()),
            "--node-config",
            node_config,
            "--max-retries",
            "20",
            *self._client_tls_args(),
        ]
        if key is not None:
            args += ["--auth-supernode-private-key", str(key.private_key)]
        if host is not None:
            args = self.namespaces.exec_prefix(host) + args
        log = self.logs / f"{name or f'supernode-{index}'}.log"
        proc = spawn(args, log=log, env=self.env)
        self.started.append(proc)
        return Node(index, proc, log, relay, host)

    # ---- Flower CLI -----------------------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 120) -> Any:
        """Run Flower's CLI against this deployment; returns its JSON answer."""
        return flwr_json(args, env=self.env, timeout=timeout)

    def submit(self, run_config: Path) -> str:
        """``flwr run`` this project with ``run_config``; returns Flower's run id."""
        answer = self.flwr("run", str(ROOT), CONNECTION, "--run-config", str(run_config), "--format", "json")
        return str(answer["run-id"])

    def run_info(self, run_id: str) -> dict[str, Any]:
        return self.flwr("ls", CONNECTION, "--run-id", run_id, "--format", "json", timeout=60)["runs"][0]

    def wait(
        self,
        run_id: str,
        *,
        poll: Callable[[], bool] | None = None,
        every_s: float = 15.0,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Until the run is finished; ``poll()`` is called every second and returning True asks
        Flower for the status at once (the run said it is done), otherwise every ``every_s``."""
        started = last = time.monotonic()
        while True:
            time.sleep(1.0)
            soon = poll() if poll else False
            if soon or time.monotonic() - last >= every_s:
                info = self.run_info(run_id)
                last = time.monotonic()
                if info["status"].startswith(FINISHED):
                    return info
                every_s = 2.0 if soon else every_s
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise DeployError(f"run {run_id} did not finish within {timeout_s:.0f} s")

    def wire_bytes(self) -> tuple[int, int]:
        """(down, up) bytes that crossed the relays so far, all nodes together."""
        counts = [n.relay.counters() for n in self.nodes]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    # ---- stop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        terminate(self.started)
        for node in self.nodes:
            node.relay.close()
        if self.namespaces is not None:
            self.namespaces.close()

    def dataplane_settings(self) -> dict[str, Any]:
        """Config values that point the run's data plane at this deployment (port, TLS files)."""
        values: dict[str, Any] = {
            "dataplane_port": self.dataplane_port,
            "dataplane_bind": self.server_host,  # loopback, or the server's bridge address (--netns)
            "dataplane_address": self.server_host,  # what the ServerApp tells the workers to dial
            "dataplane_private_network": self.use_netns and self.tls_files is None,
        }
        if self.tls_files is not None:
            values.update(
                dataplane_tls_cert=str(self.tls_files.server_cert),
                dataplane_tls_key=str(self.tls_files.server_key),
                dataplane_tls_ca=str(self.tls_files.ca_cert),
            )
        return values

    def process_table(self) -> dict[str, Any]:
        """What was started where: for the user, and for tests that kill a node on purpose."""
        return {
            "superlink": {
                "pid": self.started[0].pid if self.started else None,
                "host": self.server_host,
                "port": self.port,
            },
            "supernodes": [
                {
                    "index": n.index,
                    "pid": n.proc.pid,
                    "log": str(n.log),
                    "relay": list(n.relay.address),
                    "netns": n.host.name if n.host else None,
                    "address": n.host.node_ip if n.host else "127.0.0.1",
                }
                for n in self.nodes
            ],
        }


# ---- the `fedgan deploy --local` command ----------------------------------------------------------
def check_tools() -> None:
    """Flower's executables must be next to this Python (they come with the flwr package)."""
    bindir = Path(sys.executable).parent
    missing = [
        t
        for t in ("flwr", "flower-superlink", "flower-supernode")
        if not (bindir / t).exists() and shutil.which(t) is None
    ]
    if missing:
        raise DeployError(
            f"{', '.join(missing)} not found next to {sys.executable}; install the project "
            "(`make install`) in this environment"
        )
