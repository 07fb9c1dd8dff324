"""The Docker Compose deployment, checked without a Docker engine.

No engine runs here, so these tests check what can be checked statically: the committed files
are the generator's output, Debian's docker-compose 1.29 accepts every file combination, the
topology it resolves is the one docs/deployment/compose.md describes (checked on its resolved config,
not on our templates), and the certificate script makes a chain `openssl verify` accepts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from flwr.common.config import parse_config_args

from client.worker import private_network
from common.methods import ExperimentConfig
from simulations.deploy import compose
from tests.helpers import ROOT

BASE = (compose.BASE_FILE,)
WITH_TLS = (compose.BASE_FILE, compose.TLS_FILE)
TLS_FLAGS = ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile", "--root-certificates")
SUPEREXEC_SERVICES = re.compile(r"^(serverapp|clientapp-\d+)$")


def _env(root: Path = ROOT) -> dict[str, str]:
    """The ``KEY=value`` lines of ``.env``."""
    lines = (line.strip() for line in (root / compose.ENV_FILE).read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _docker_compose() -> str:
    """Path of docker-compose; a missing one fails (the check must not silently vanish)."""
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail(
            "docker-compose is not installed; `make test` installs it (or run `apt-get install docker-compose`)"
        )
    return path


def _run_compose(files: tuple[str, ...], *args: str, cwd: Path = ROOT) -> str:
    """Run ``docker-compose -f ... config ARGS`` with only ``.env`` as the variables' source."""
    command = [_docker_compose()]
    for name in files:
        command += ["-f", name]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    proc = subprocess.run([*command, "config", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"docker-compose {' '.join(command[1:])} config: {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def five_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the files generated for N=5 next to a copy of ``.env``."""
    root = tmp_path_factory.mktemp("compose5")
    shutil.copy(ROOT / compose.ENV_FILE, root / compose.ENV_FILE)
    compose.write(5, root)
    return root


@pytest.fixture(scope="module", params=[ROOT, "five"], ids=["committed", "generated-5"])
def deployment(request: pytest.FixtureRequest) -> tuple[Path, int]:
    """(directory, N) for the committed files and for a generated N=5 deployment."""
    root = ROOT if request.param == ROOT else request.getfixturevalue("five_clients")
    return root, int(_env(root)["NUM_CLIENTS"])


@cache
def _resolved(root: Path, files: tuple[str, ...]) -> str:
    """``docker-compose config`` output, once per directory and file list (each call costs ~1 s)."""
    return _run_compose(files, cwd=root)


def _services(root: Path, files: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return yaml.safe_load(_resolved(root, files))["services"]


def _flag(service: dict[str, Any], flag: str) -> str:
    """The value following ``flag`` in the service's command."""
    command = service["command"]
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Container path -> (source, mode) of the service's volumes as docker-compose resolved them."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            mode = "ro" if volume.get("read_only") else "rw"
            mounts[volume["target"]] = (volume["source"], mode)
        else:
            source, target, *mode = volume.split(":")
            mounts[target] = (source, mode[0] if mode else "rw")
    return mounts


def _without_tls(command: list[str]) -> list[str]:
    """The command minus ``--insecure`` and the certificate flags with their values."""
    kept, skip = [], False
    for arg in command:
        if skip or arg == "--insecure":
            skip = False
            continue
        skip = arg in TLS_FLAGS
        if not skip:
            kept.append(arg)
    return kept


# ---- (1) the committed files are the generator's output


def test_committed_files_equal_generator_output() -> None:
    num_clients = int(_env()["NUM_CLIENTS"])
    assert num_clients == compose.DEFAULT_NUM_CLIENTS
    for name, text in compose.rendered(num_clients).items():
        assert (ROOT / name).read_text() == text, (
            f"{name} is stale: run `python -m simulations.deploy.compose --num-clients {num_clients} --write`"
        )


def test_with_num_clients_rewrites_only_that_line() -> None:
    env = "# c\nFLWR_VERSION=1.41.0\nNUM_CLIENTS=3\nX=1\n"
    assert compose.with_num_clients(env, 7) == "# c\nFLWR_VERSION=1.41.0\nNUM_CLIENTS=7\nX=1\n"
    assert compose.with_num_clients("A=1\n", 2) == "A=1\nNUM_CLIENTS=2\n"


def test_generator_rejects_zero_clients() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        compose.rendered(0)


# ---- (2) docker-compose 1.29 accepts every combination


@pytest.mark.parametrize("files", [BASE, WITH_TLS], ids=["plain", "tls"])
def test_docker_compose_validates(files: tuple[str, ...], deployment: tuple[Path, int]) -> None:
    _run_compose(files, "-q", cwd=deployment[0])


# ---- (3) the topology docker-compose resolves


def test_one_supernode_per_partition(deployment: tuple[Path, int]) -> None:
    root, num_clients = deployment
    services = _services(root, BASE)
    supernodes = sorted(name for name in services if name.startswith("supernode-"))
    assert supernodes == [f"supernode-{i}" for i in range(1, num_clients + 1)]
    configs = [parse_config_args([_flag(services[name], "--node-config")]) for name in supernodes]
    assert sorted(c["partition-id"] for c in configs) == list(range(num_clients))
    for config in configs:
        assert config["num-partitions"] == num_clients
        assert (config["state-dir"], config["data-dir"]) == ("/state", "/data")
    for name in supernodes:
        assert _flag(services[name], "--superlink") == "superlink:8000"
        assert _flag(services[name], "--isolation") == "process"
        assert "superlink" in services[name]["depends_on"]


def test_each_supernode_has_its_clientapp(deployment: tuple[Path, int]) -> None:
    root, num_clients = deployment
    services = _services(root, BASE)
    state_volumes = set()
    for i in range(1, num_clients + 1):
        supernode, clientapp = services[f"supernode-{i}"], services[f"clientapp-{i}"]
        port = _flag(supernode, "--port")
        assert _flag(supernode, "--host") == "0.0.0.0"
        assert _flag(clientapp, "--runtime-api-address") == f"supernode-{i}:{port}"
        assert f"supernode-{i}" in clientapp["depends_on"]
        mounts = _mounts(clientapp)
        assert mounts["/data"] == (str((root / _env(root)["FEDGAN_DATA_DIR"]).resolve()), "ro")
        state_volumes.add(mounts["/state"][0])
        assert clientapp["image"] == services["serverapp"]["image"]
    assert state_volumes == {f"node-{i}-state" for i in range(1, num_clients + 1)}


def test_serverapp_and_superlink(deployment: tuple[Path, int]) -> None:
    root, _ = deployment
    env, services = _env(root), _services(root, BASE)
    superlink, serverapp = services["superlink"], services["serverapp"]
    assert _flag(superlink, "--port") == "8000" and _flag(superlink, "--host") == "0.0.0.0"
    assert _flag(superlink, "--isolation") == "process"
    assert "--disable-runtime-dependency-installation" in superlink["command"]
    assert any(str(p).endswith(f"{env['SUPERLINK_PORT']}:8000/tcp") for p in superlink["ports"])
    assert _flag(serverapp, "--runtime-api-address") == "superlink:8000"
    assert "superlink" in serverapp["depends_on"]
    assert _mounts(serverapp)["/app/runs"] == (str((root / env["FEDGAN_RUNS_DIR"]).resolve()), "rw")
    assert env["DATAPLANE_PORT"] in [str(p) for p in serverapp["expose"]]
    assert serverapp["build"]["args"]["FLWR_VERSION"] == env["FLWR_VERSION"]


def test_process_spawning_services_have_init(deployment: tuple[Path, int]) -> None:
    services = _services(deployment[0], BASE)
    spawning = [name for name in services if SUPEREXEC_SERVICES.match(name)]
    assert len(spawning) == deployment[1] + 1
    for name, service in services.items():
        assert service.get("init") is True, f"{name} lacks init: true"
        assert service["restart"] == "unless-stopped"
        assert "--insecure" in service["command"], f"{name}: plain deployment without --insecure"


def test_tls_overlay_swaps_insecure_for_mounted_certificates(deployment: tuple[Path, int]) -> None:
    root, _ = deployment
    plain, tls = _services(root, BASE), _services(root, WITH_TLS)
    certs_dir = (root / _env(root)["FEDGAN_CERTS_DIR"]).resolve()
    for name, service in tls.items():
        if name.startswith("clientapp-"):
            # The SuperNode's own runtime API stays plain inside a node pair (see the overlay); the
            # ClientApp gets its node's secure-aggregation identity, read-only, from the certificates folder.
            assert service["command"] == plain[name]["command"]
            source, mode = _mounts(service)["/app/secagg"]
            assert (Path(source), mode) == (certs_dir / "secagg" / f"node-{name.split('-')[1]}", "ro"), name
            continue
        assert "--insecure" not in service["command"], name
        # the same arguments, but for the plain file's private-network mark on each node, and the
        # TLS nodes' secure-aggregation identity files (as their ClientApps see them)
        unmarked = [a.replace(" dataplane-private-network=true", "") for a in _without_tls(plain[name]["command"])]
        shown = [
            re.sub(r" secagg-identity='[^']*' secagg-peers='[^']*'", "", a) for a in _without_tls(service["command"])
        ]
        assert shown == unmarked, name
        mounts = _mounts(service)
        flags = [f for f in TLS_FLAGS if f in service["command"]]
        assert flags, f"{name} has no certificate flag"
        for flag in flags:
            source, mode = mounts[_flag(service, flag)]
            assert (Path(source).parent, mode) == (certs_dir, "ro"), f"{name} {flag}"
    assert [f for f in TLS_FLAGS if f in tls["superlink"]["command"]] == list(TLS_FLAGS[:3])


@pytest.mark.parametrize("files", [BASE, WITH_TLS], ids=["plain", "tls"])
def test_supernodes_send_their_workers_to_the_serverapp_data_plane(
    files: tuple[str, ...], deployment: tuple[Path, int]
) -> None:
    root, num_clients = deployment
    env, services = _env(root), _services(root, files)
    port = env["DATAPLANE_PORT"]
    for i in range(1, num_clients + 1):
        config = parse_config_args([_flag(services[f"supernode-{i}"], "--node-config")])
        assert config["dataplane-address"] == f"{compose.DATAPLANE_HOST}:{port}"
        # plaintext on the plain file's private compose network only; the TLS overlay drops the mark
        assert private_network(config) == (files == BASE)
    assert compose.DATAPLANE_HOST == "serverapp" and "serverapp" in services
    assert port in [str(p) for p in services["serverapp"]["expose"]]


def test_tls_overlay_serves_the_data_plane_from_mounted_certificates(deployment: tuple[Path, int]) -> None:
    root, _ = deployment
    env = _env(root)
    serverapp = _services(root, WITH_TLS)["serverapp"]
    certs_dir = (root / env["FEDGAN_CERTS_DIR"]).resolve()
    # The run config the overlay documents is one ExperimentConfig accepts, and names the mounts.
    run_config = parse_config_args([compose.tls_run_config(env["DATAPLANE_PORT"])])
    cfg = ExperimentConfig.from_run_config(run_config)
    assert (cfg.dataplane_bind, str(cfg.dataplane_port)) == ("0.0.0.0", env["DATAPLANE_PORT"])
    mounts = _mounts(serverapp)
    for path, name in (
        (cfg.dataplane_tls_cert, "server.pem"),
        (cfg.dataplane_tls_key, "server.key"),
        (cfg.dataplane_tls_ca, "ca.crt"),
    ):
        assert mounts[path] == (str(certs_dir / name), "ro"), path
    overlay = (root / compose.TLS_FILE).read_text()
    header = " ".join(line.lstrip("# ") for line in overlay.splitlines() if line.startswith("#"))
    assert compose.tls_run_config("DATAPLANE_PORT") in header


def test_plain_deployment_documents_the_flower_message_path() -> None:
    assert "dataplane='flower'" in (ROOT / compose.BASE_FILE).read_text()


def test_dockerfile_pins_match_the_project() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "FROM flwr/superexec:${FLWR_VERSION}" in dockerfile
    torch = re.search(r'"torch==([\d.]+)"', pyproject).group(1)
    assert f"ARG TORCH_VERSION={torch}\n" in dockerfile
    flwr_minor = re.search(r'"flwr\[simulation\]==([\d.]+)\.\*"', pyproject).group(1)
    assert _env()["FLWR_VERSION"].startswith(flwr_minor + ".")
    assert "dockerfile_inline" not in (ROOT / compose.BASE_FILE).read_text()


# ---- (4) the certificate script


def _openssl(*args: str) -> str:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_generate_sh_makes_a_verifiable_superlink_certificate(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    script = ROOT / "deploy" / "certs" / "generate.sh"
    env = {**os.environ, "KEY_BITS": "2048"}  # smaller keys only to keep the test fast
    subprocess.run(["bash", str(script), str(out)], env=env, check=True, capture_output=True)
    assert {p.name for p in out.iterdir()} == {"ca.crt", "ca.key", "server.pem", "server.key"}
    assert (out / "server.key").stat().st_mode & 0o077 == 0
    assert _openssl("verify", "-CAfile", str(out / "ca.crt"), str(out / "server.pem")).strip().endswith(": OK")
    sans = _openssl("x509", "-in", str(out / "server.pem"), "-noout", "-ext", "subjectAltName")
    # One certificate for the SuperLink and the data plane, which the workers dial as serverapp.
    for name in ("DNS:superlink", f"DNS:{compose.DATAPLANE_HOST}", "DNS:localhost", "IP Address:127.0.0.1"):
        assert name in sans
    # The overlay mounts exactly what the script writes (and never the CA key).
    overlay = (ROOT / compose.TLS_FILE).read_text()
    mounted = set(re.findall(r"\$\{FEDGAN_CERTS_DIR\}/([\w.]+):", overlay))
    assert mounted == {"ca.crt", "server.pem", "server.key"}
    before = (out / "ca.crt").read_bytes()
    subprocess.run(["bash", str(script), str(out)], env=env, check=True, capture_output=True)
    assert (out / "ca.crt").read_bytes() == before, "a second run must not replace the CA"
