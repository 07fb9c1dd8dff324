"""The compose files of a deployment across hosts, checked without an engine, and the per-host files.

``docker-compose.server.yml`` (on top of the base file and the TLS overlay, on the server host) and
``docker-compose.nodes.yml`` (alone, on a node host) must be what docker-compose 1.29 accepts, and
resolve to the topology docs/deployment/hosts.md describes: nodes that dial the server host by
address with TLS and their own key, the server's SuperLink authenticating them and its data plane
published. ``pki.make_hosts`` must lay out exactly the files those mounts name. The files also run
for real, on one engine, in test_compose_up.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from flwr.common.config import parse_config_args

from client.worker import private_network
from common.methods import ExperimentConfig
from simulations.deploy import compose, compose_hosts, pki
from tests.deployment.test_compose import _docker_compose, _env, _flag, _mounts
from tests.helpers import ROOT

SERVER = "203.0.113.10"  # a documentation address: the server host as the node hosts reach it
ON_SERVER = (compose.BASE_FILE, compose.TLS_FILE, compose_hosts.SERVER_FILE)
ON_NODES = (compose_hosts.NODES_FILE,)


def resolved(files: tuple[str, ...], **variables: str) -> subprocess.CompletedProcess:
    """``docker-compose -f ... config`` with ``.env`` and ``variables`` as the only sources."""
    command = [_docker_compose()] + [arg for name in files for arg in ("-f", name)] + ["config"]
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": "/", **variables}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def services(files: tuple[str, ...], **variables: str) -> dict:
    proc = resolved(files, **variables)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_the_nodes_file_refuses_to_start_without_the_servers_address() -> None:
    proc = resolved(ON_NODES)
    assert proc.returncode != 0
    assert f"set {compose_hosts.SERVER_HOST_VAR} to the server host's address" in proc.stderr


def test_nodes_dial_the_server_host_by_address_with_tls_and_their_own_key() -> None:
    env = _env()
    config = services(ON_NODES, FEDGAN_SERVER_HOST=SERVER)
    nodes = config["services"]
    n = int(env["NUM_CLIENTS"])
    assert sorted(nodes) == sorted(f"{kind}-{i}" for kind in ("supernode", "clientapp") for i in range(1, n + 1))
    hosts_dir = (ROOT / env["FEDGAN_HOSTS_DIR"]).resolve()
    partitions = []
    for i in range(1, n + 1):
        node = nodes[f"supernode-{i}"]
        assert "--insecure" not in node["command"] and "depends_on" not in node  # no SuperLink on this host
        assert _flag(node, "--superlink") == f"{SERVER}:{env['SUPERLINK_PORT']}"
        mounts = _mounts(node)
        ca, key = _flag(node, "--root-certificates"), _flag(node, "--auth-supernode-private-key")
        assert mounts[ca] == (str(hosts_dir / f"supernode-{i}" / "ca.crt"), "ro")
        assert mounts[key] == (str(hosts_dir / f"supernode-{i}" / f"supernode-{i}"), "ro")
        node_config = parse_config_args([_flag(node, "--node-config")])
        assert node_config["dataplane-address"] == f"{SERVER}:{env['DATAPLANE_PORT']}"
        assert not private_network(node_config)  # across hosts the worker insists on TLS
        partitions.append(node_config["partition-id"])
        assert _flag(nodes[f"clientapp-{i}"], "--runtime-api-address") == f"supernode-{i}:{_flag(node, '--port')}"
    assert partitions == list(range(n))
    subnet = config["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert subnet == env["FEDGAN_NODES_SUBNET"] != env["FEDGAN_SUBNET"]  # both fit on one engine


def test_the_server_overlay_authenticates_nodes_and_publishes_the_data_plane() -> None:
    env = _env()
    tls = services((compose.BASE_FILE, compose.TLS_FILE))["services"]
    server = services(ON_SERVER)["services"]
    assert server["superlink"]["command"] == tls["superlink"]["command"] + ["--enable-supernode-auth"]
    port = env["DATAPLANE_PORT"]
    assert server["serverapp"]["ports"] == [f"{env['DATAPLANE_HOST_IP']}:{port}:{port}/tcp"]
    assert "ports" not in tls["serverapp"]  # one host's files keep the data plane on the compose network
    assert env["DATAPLANE_HOST_IP"] == env["SUPERLINK_HOST_IP"] == "127.0.0.1"  # loopback until opened on purpose
    # the run config in the header is one ExperimentConfig accepts: TLS, bound in the container,
    # advertised at the server host's address
    header = " ".join(
        line.lstrip("# ") for line in (ROOT / compose_hosts.SERVER_FILE).read_text().splitlines() if line[:1] == "#"
    )
    run_config = compose_hosts.across_hosts_run_config("DATAPLANE_PORT", "SERVER_HOST")
    assert run_config in header
    cfg = ExperimentConfig.from_run_config(parse_config_args([compose_hosts.across_hosts_run_config(9400, SERVER)]))
    assert (cfg.dataplane_bind, cfg.dataplane_address, cfg.dataplane_port) == ("0.0.0.0", SERVER, 9400)
    assert cfg.dataplane_tls_cert and not cfg.dataplane_private_network


def test_generated_for_five_nodes(tmp_path: Path) -> None:
    (tmp_path / compose.ENV_FILE).write_text((ROOT / compose.ENV_FILE).read_text())
    compose.write(5, tmp_path)
    command = [_docker_compose(), "-f", compose_hosts.NODES_FILE, "config"]
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": "/", "FEDGAN_SERVER_HOST": SERVER}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    nodes = yaml.safe_load(proc.stdout)["services"]
    assert sorted(k for k in nodes if k.startswith("supernode-")) == [f"supernode-{i}" for i in range(1, 6)]


def test_make_hosts_lays_out_what_each_host_mounts(tmp_path: Path) -> None:
    layout = pki.make_hosts(tmp_path / "hosts", server_hosts=[SERVER], num_nodes=2)
    names = {host: sorted(p.name for p in files) for host, files in layout.items()}
    assert names == {
        "server": ["ca.crt", "server.key", "server.pem", "supernode-1.pub", "supernode-2.pub"],
        "supernode-1": ["ca.crt", "supernode-1"],
        "supernode-2": ["ca.crt", "supernode-2"],
    }
    for host in layout:  # every folder holds a private key, and says so
        assert (tmp_path / "hosts" / host / "DO_NOT_PUBLISH.txt").is_file()
        assert sorted(p.name for p in (tmp_path / "hosts" / host).iterdir()) == sorted(
            [*names[host], "DO_NOT_PUBLISH.txt"]
        )
    server = tmp_path / "hosts" / "server"
    cert = x509.load_pem_x509_certificate((server / "server.pem").read_bytes())
    ca = x509.load_pem_x509_certificate((server / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {SERVER, "127.0.0.1"}
    assert set(sans.get_values_for_type(x509.DNSName)) == {"superlink", "serverapp", "localhost"}
    for i in (1, 2):
        node = tmp_path / "hosts" / f"supernode-{i}"
        assert (node / "ca.crt").read_bytes() == (server / "ca.crt").read_bytes()
        private = serialization.load_ssh_private_key((node / f"supernode-{i}").read_bytes(), None)
        public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        assert (server / f"supernode-{i}.pub").read_bytes().strip() == public  # the key the server registers
        assert (node / f"supernode-{i}").stat().st_mode & 0o077 == 0
    with pytest.raises(FileExistsError, match="not empty"):
        pki.make_hosts(tmp_path / "hosts", server_hosts=[SERVER], num_nodes=1)
