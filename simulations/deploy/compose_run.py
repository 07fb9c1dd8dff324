"""Drive the Docker Compose deployment the way docs/deployment/compose.md does, from Python.

The compose test (tests/deployment/test_compose_up.py) and the latency benchmark
(bench/deploy_latency.py --compose) run exactly these commands: `docker-compose up -d` of the plain
file or the TLS overlay, `flwr run . <federation> --stream --run-config ...`, `flwr ls --format
json`, and `docker-compose down -v`; a Docker engine (DOCKER_HOST) and the images must be there
(deploy/offline/dockerd.sh and build-images.sh where no engine runs and no registry is reachable).
``ComposeAcrossHosts`` does the same for docs/deployment/hosts.md's "With Docker Compose", both hosts'
projects on one engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import compose, identities
from .local import DeployError, flwr_json, free_port

ROOT = compose.ROOT
OFFLINE = ROOT / "deploy" / "offline"
BIN = Path(sys.executable).parent
FLOWER_UID = 49999  # Flower's images run as this user: the runs directory and server.key must be its


class ComposeError(RuntimeError):
    """A compose, flwr or docker command failed; the message holds its output."""


def poll(check: Callable[[], tuple[bool, str]], timeout_s: float, what: str) -> None:
    """Call ``check`` every second until it says done; ComposeError after ``timeout_s`` naming
    ``what`` and the last thing seen (its answer, or the DeployError it raised)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, seen = check()
        except DeployError as err:
            done, seen = False, str(err)
        if done:
            return
        if time.monotonic() > deadline:
            raise ComposeError(f"waited {timeout_s:.0f} s for {what}; last: {seen}")
        time.sleep(1.0)


def sh(*args: str | Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run a command in the repository root; its stdout, or ComposeError with its output."""
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ComposeError(
            f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def env_file() -> dict[str, str]:
    """The ``KEY=value`` lines of ``.env`` (compose's defaults; the environment overrides them)."""
    lines = (line.strip() for line in (ROOT / compose.ENV_FILE).read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def run_config(**values: object) -> str:
    """``values`` (ExperimentConfig field names, checked) in Flower's run-config syntax, each value
    as the pyproject's run-config table writes it (``toml_value``)."""
    from common.methods import ExperimentConfig
    from simulations.devtools.flwr_config import toml_value

    run = ExperimentConfig.from_mapping(values, source="run config").to_run_config()
    keys = [name.replace("_", "-") for name in values]
    return " ".join(f"{key}={toml_value(run[key])}" for key in keys)


@dataclass
class ComposeDeployment:
    """One compose project whose host directories (runs, data, certificates, FLWR_HOME) live in
    ``workdir``; ``engine_env`` names the engine (DOCKER_HOST)."""

    workdir: Path
    engine_env: dict[str, str]
    project: str = field(default_factory=lambda: f"fedgan-{os.getpid()}")
    files: tuple[str, ...] = ()
    stream: str = ""  # what the last `flwr run --stream` printed (the ServerApp's log)

    def __post_init__(self) -> None:
        self.runs, self.data, self.certs, self.flwr_home = (self.workdir / n for n in ("runs", "data", "certs", "flwr"))
        for path in (self.runs, self.data, self.flwr_home):
            path.mkdir(parents=True, exist_ok=True)
        os.chown(self.runs, FLOWER_UID, FLOWER_UID)
        self.port = free_port()
        (self.flwr_home / "config.toml").write_text(
            f'[superlink.docker]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n\n'
            f'[superlink.docker-tls]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.certs}/ca.crt"\n'
        )
        self.env = dict(
            self.engine_env,
            PATH=f"{BIN}{os.pathsep}{self.engine_env.get('PATH', os.environ['PATH'])}",
            COMPOSE_PROJECT_NAME=self.project,
            SUPERLINK_PORT=str(self.port),
            FEDGAN_RUNS_DIR=str(self.runs),
            FEDGAN_DATA_DIR=str(self.data),
            FEDGAN_CERTS_DIR=str(self.certs),
            FLWR_HOME=str(self.flwr_home),
        )
        self.dataplane_port = env_file()["DATAPLANE_PORT"]
        self.nodes_project = self.project  # the project whose volumes hold the nodes' state

    # ---- the documented commands --------------------------------------------------------------
    def up(self, *, tls: bool) -> None:
        """`docker-compose [-f base -f tls] up -d`; with TLS, certificates are generated first (a
        missing mounted file would become a directory) and server.key given to uid 49999."""
        num_nodes = int(env_file()["NUM_CLIENTS"])
        if tls:
            sh("bash", ROOT / "deploy/certs/generate.sh", self.certs, env=dict(self.env, KEY_BITS="2048"))
            os.chown(self.certs / "server.key", FLOWER_UID, FLOWER_UID)
            identities.make(self.certs / "secagg", num_nodes, owner=FLOWER_UID)
        self.files = (compose.BASE_FILE, compose.TLS_FILE) if tls else (compose.BASE_FILE,)
        sh("docker-compose", *self._file_args(), "up", "-d", env=self.env)
        self._wait_for_superlink(timeout_s=120)
        self._wait_for_nodes(num_nodes, timeout_s=300)

    def _wait_for_superlink(self, timeout_s: float) -> None:
        """`up -d` returns once the containers exist; the SuperLink answers `flwr ls` a few seconds
        later (the documented `flwr run` right after `up` would otherwise find nothing listening)."""

        def answers() -> tuple[bool, str]:
            self.flwr_ls()  # DeployError until it listens
            return True, ""

        poll(answers, timeout_s, "the SuperLink to answer `flwr ls`")

    def _wait_for_nodes(self, count: int, timeout_s: float) -> None:
        """Until ``count`` SuperNodes are online (`flwr supernode list`): a run started before they
        are waits for them only as long as the ServerApp's node wait (120 s), which a loaded machine
        starting six containers and a TLS handshake each can exceed."""

        def online() -> tuple[bool, str]:
            nodes = flwr_json(("supernode", "list", self.federation, "--format", "json"), env=self.env, timeout=60)
            statuses = {n["node-id"]: n["status"] for n in nodes["nodes"]}
            return sum(s == "online" for s in statuses.values()) >= count, f"statuses {statuses}"

        poll(online, timeout_s, f"{count} SuperNodes online")

    def flwr_ls(self) -> list[dict]:
        """`flwr ls <federation> --format json`: the runs."""
        return flwr_json(("ls", self.federation, "--format", "json"), env=self.env, timeout=60)["runs"]

    @property
    def federation(self) -> str:
        """The `flwr` connection docs/deployment/compose.md configures for the files in use."""
        return "docker-tls" if compose.TLS_FILE in self.files else "docker"

    def flwr_run(self, name: str, **config: object) -> dict:
        """A run through the gRPC data plane (plaintext on the plain file's private network, TLS with
        the overlay); returns its summary.json with Flower's status of it under ``flwr_status``."""
        federation = self.federation
        dataplane = self.dataplane_run_config()
        self.stream = sh(
            BIN / "flwr",
            "run",
            ".",
            federation,
            "--stream",
            "--run-config",
            f"{run_config(out=f'runs/{name}', **config)} {dataplane}",
            env=self.env,
        )
        runs = self.flwr_ls()
        path = self.runs / name / "summary.json"
        if not path.is_file():
            raise ComposeError(self._why_no_summary(name, runs))
        summary = json.loads(path.read_text())
        summary["flwr_status"] = [r["status"] for r in runs]
        return summary

    def _why_no_summary(self, name: str, runs: list[dict]) -> str:
        """A run that wrote no summary failed inside the ServerApp or a ClientApp: what `flwr run
        --stream` printed, Flower's status of each run and the apps' container logs, so the failure
        names its cause instead of a missing file."""
        return (
            f"run {name!r} wrote no summary.json; Flower's runs: {[(r.get('run-id'), r['status']) for r in runs]}\n"
            f"flwr run --stream printed:\n{self.stream[-4000:]}\n--- containers, last 40 lines each ---\n"
            + "\n".join(self._logs(compose_args, env) for compose_args, env in self._projects())
        )

    def _projects(self) -> list[tuple[list[str], dict[str, str]]]:
        """Each compose project's file arguments and environment (one here; two across hosts)."""
        return [(self._file_args(), self.env)]

    @staticmethod
    def _logs(compose_args: list[str], env: dict[str, str]) -> str:
        """The last lines of every service's log in one project (kept short: they go in an error)."""
        try:
            return sh("docker-compose", *compose_args, "logs", "--no-color", "--tail", "40", env=env)[-8000:]
        except (ComposeError, subprocess.TimeoutExpired) as err:
            return f"(no logs: {err})"

    def dataplane_run_config(self) -> str:
        """The data plane's run-config keys for the files in use (the headers' run configs)."""
        tls = compose.TLS_FILE in self.files
        return (compose.tls_run_config if tls else compose.plain_run_config)(self.dataplane_port)

    def node_volumes(self, num_clients: int) -> dict[int, list[str]]:
        """The files in each node's state volume, listed by a throwaway container."""
        image = self.env.get("FEDGAN_IMAGE") or env_file()["FEDGAN_IMAGE"]
        found = {}
        for i in range(1, num_clients + 1):
            volume = f"{self.nodes_project}_node-{i}-state"
            out = sh(
                "docker", "run", "--rm", "-v", f"{volume}:/state", "--entrypoint", "ls", image, "/state", env=self.env
            )
            found[i] = sorted(out.split())
        return found

    def down(self) -> None:
        """`docker-compose down -v`: containers, the network and the node volumes."""
        if self.files:
            sh("docker-compose", *self._file_args(), "down", "-v", env=self.env, timeout=300)
            self.files = ()

    def leftovers(self) -> tuple[str, str]:
        """Containers and networks of this project still there (both empty after ``down``)."""
        label = f"label=com.docker.compose.project={self.project}"
        containers = sh("docker", "ps", "-aq", "--filter", label, env=self.env).strip()
        networks = sh("docker", "network", "ls", "-q", "--filter", label, env=self.env).strip()
        return containers, networks

    def _file_args(self) -> list[str]:
        return [arg for name in self.files for arg in ("-f", name)]


@dataclass
class ComposeAcrossHosts(ComposeDeployment):
    """docs/deployment/hosts.md's "With Docker Compose" on one engine: the server host's project
    (docker-compose.yml + TLS overlay + docker-compose.server.yml: superlink and serverapp only) and a
    node host's project (docker-compose.nodes.yml) with networks of their own, so the nodes reach
    the server only by address: its network's gateway, where the server publishes its two ports (a
    second host would use the server host's address). Files from ``pki.make_hosts``; every node's
    key registered with ``flwr supernode register`` before the nodes start."""

    num_nodes: int = compose.DEFAULT_NUM_CLIENTS

    def __post_init__(self) -> None:
        import ipaddress

        from . import pki

        super().__post_init__()
        subnet = self.env.get("FEDGAN_SUBNET") or env_file()["FEDGAN_SUBNET"]
        self.server_host = str(ipaddress.ip_network(subnet)[1])  # the server network's gateway
        self.hosts = self.workdir / "hosts"
        pki.make_hosts(self.hosts, server_hosts=[self.server_host], num_nodes=self.num_nodes)
        for path in [self.hosts / "server" / "server.key", *self.hosts.glob("supernode-*/supernode-*")]:
            os.chown(path, FLOWER_UID, FLOWER_UID)  # read by Flower's images (uid 49999)
        with (self.flwr_home / "config.toml").open("a") as config:
            config.write(
                f'\n[superlink.{self.ACROSS}]\naddress = "{self.server_host}:{self.port}"\n'
                f'root-certificates = "{self.hosts / "server" / "ca.crt"}"\n'
            )
        self.env.update(
            SUPERLINK_HOST_IP=self.server_host,
            DATAPLANE_HOST_IP=self.server_host,
            FEDGAN_CERTS_DIR=str(self.hosts / "server"),
        )
        self.nodes_project = f"{self.project}-nodes"
        self.nodes_env = dict(
            self.env,
            COMPOSE_PROJECT_NAME=self.nodes_project,
            FEDGAN_SERVER_HOST=self.server_host,
            FEDGAN_HOSTS_DIR=str(self.hosts),
        )

    ACROSS = "across-hosts"  # the `flwr` connection to the server host's published SuperLink

    @property
    def federation(self) -> str:
        return self.ACROSS

    def up(self, *, tls: bool = True) -> None:
        """The server host's `up -d superlink serverapp`, the nodes' keys registered, then the node
        host's `up -d` (TLS only: across hosts there is no plain variant)."""
        from . import compose_hosts

        self.files = (compose.BASE_FILE, compose.TLS_FILE, compose_hosts.SERVER_FILE)
        sh("docker-compose", *self._file_args(), "up", "-d", "superlink", "serverapp", env=self.env)
        self._wait_for_superlink(timeout_s=120)
        for key in sorted((self.hosts / "server").glob("supernode-*.pub")):
            flwr_json(("supernode", "register", str(key), self.ACROSS, "--format", "json"), env=self.env)
        sh("docker-compose", "-f", compose_hosts.NODES_FILE, "up", "-d", env=self.nodes_env)
        self._wait_for_nodes(self.num_nodes, timeout_s=300)

    def _projects(self) -> list[tuple[list[str], dict[str, str]]]:
        from . import compose_hosts

        return [*super()._projects(), (["-f", compose_hosts.NODES_FILE], self.nodes_env)]

    def dataplane_run_config(self) -> str:
        from . import compose_hosts

        return compose_hosts.across_hosts_run_config(self.dataplane_port, self.server_host)

    def networks(self, project: str) -> dict[str, list[str]]:
        """Container name -> the networks it is on, for one of the two projects."""
        label = f"label=com.docker.compose.project={project}"
        names = sh("docker", "ps", "-q", "--filter", label, env=self.env).split()
        found = {}
        for container in names:
            out = sh("docker", "inspect", "-f", "{{.Name}} {{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                     container, env=self.env).split()  # fmt: skip
            found[out[0].lstrip("/")] = sorted(out[1:])
        return found

    def down(self) -> None:
        from . import compose_hosts

        if self.files:
            sh("docker-compose", "-f", compose_hosts.NODES_FILE, "down", "-v", env=self.nodes_env, timeout=300)
        super().down()

    def leftovers(self) -> tuple[str, str]:
        server = super().leftovers()
        label = f"label=com.docker.compose.project={self.nodes_project}"
        containers = sh("docker", "ps", "-aq", "--filter", label, env=self.env).strip()
        networks = sh("docker", "network", "ls", "-q", "--filter", label, env=self.env).strip()
        return server[0] + containers, server[1] + networks


def start_engine(state: Path, env: dict[str, str]) -> dict[str, str]:
    """deploy/offline/dockerd.sh start: ``env`` with DOCKER_HOST naming the new engine."""
    return dict(env, DOCKER_HOST=sh("bash", OFFLINE / "dockerd.sh", "start", state, env=env).strip())


def stop_engine(state: Path, env: dict[str, str]) -> None:
    sh("bash", OFFLINE / "dockerd.sh", "stop", state, env=env, timeout=120)


def build_images(env: dict[str, str]) -> None:
    """deploy/offline/build-images.sh with this interpreter's pip."""
    sh("bash", OFFLINE / "build-images.sh", env=dict(env, PYTHON=sys.executable), timeout=1200)
