"""The Docker Compose deployment, started for real: docs/deployment/compose.md's commands, run in order.

A Docker engine of our own starts (deploy/offline/dockerd.sh), the images are built without a
registry (deploy/offline/build-images.sh: a Debian base from mmdebstrap, stand-ins for Flower's
images, ours from the unchanged Dockerfile), and then, as a user would: `docker-compose up` of the
plain file, a short GS-WGAN run with `flwr run` (plaintext data plane on the private compose
network), `down -v`, the same with the TLS overlay (data plane over TLS), `down -v`, and the
engine stops. Then docs/deployment/hosts.md's "With Docker Compose": the server host's project and
the node host's docker-compose.nodes.yml as two projects, the nodes dialing the server by address.
Each run's per-client queries, ε and bytes must equal the same configuration's in-process
simulation, every run must have gone through the gRPC data plane, and each node's state must stay
in its own volume. Skipped, with the reason, only where no engine can start (not
root, or no dockerd).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulations.deploy import compose
from simulations.deploy.compose_run import ComposeAcrossHosts, ComposeDeployment
from tests import compose_engine
from tests.helpers import ROOT, flags

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_deployment_at_a_time")]
BIN = Path(sys.executable).parent
# Tiny, uncompressed (message sizes do not depend on the values) and the server's sampling repeated
# (testing flag), so the simulation asks the same clients at the same steps as the deployment.
RUN = dict(
    num_clients=compose.DEFAULT_NUM_CLIENTS,
    steps=4,
    model="tiny",
    batch_size=8,
    n_critic=1,
    synthetic_samples_per_writer=24,
    wire_compression="none",
    sampling_seed=1,
    eval=False,
)
# DP-MERF through secure sums (issue 41): the nodes' identities mounted by the TLS overlay, the four
# rounds over the TLS data plane, one cohort of the three nodes
SECURE_RUN = dict(
    RUN, steps=2, strategy="dp-merf", merf_features=20, secure_aggregation=True, secagg_cohort=RUN["num_clients"]
)
# each node's own volume: its client's state, its own ledger of every release (with its release counter), and the marker
EACH_NODE_ALONE = {
    i: [
        "DO_NOT_PUBLISH.txt",
        f"client-{i - 1:05d}.pt",
        f"node-ledger-{i - 1:05d}.count",
        f"node-ledger-{i - 1:05d}.json",
    ]
    for i in range(1, RUN["num_clients"] + 1)
}


@pytest.fixture(scope="module")
def engine():
    """A dockerd of our own with the images built, prepared while the other tests ran and stopped
    at the end of the session (tests/compose_engine.py)."""
    return compose_engine.wait()


def simulate(out: Path, run: dict) -> dict:
    """``run``'s in-process simulation, which a compose run of it must equal."""
    argv = [str(BIN / "fedgan"), "simulate", *flags(transport="inprocess", progress=False, out=out, **run)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same configuration's in-process simulation, which every compose run must equal."""
    return simulate(tmp_path_factory.mktemp("compose-sim") / "simulated", RUN)


def assert_matches(deployed: dict, sim: dict, run: dict = RUN) -> None:
    assert "finished:completed" in deployed["flwr_status"], deployed["flwr_status"]
    assert deployed["status"] == "completed" and deployed["steps_completed"] == run["steps"]
    assert deployed["transport"] == "flower-run+grpc-dataplane"  # the data plane carried the steps
    for ours, theirs in zip(deployed["clients"], sim["clients"], strict=True):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert ours[key] == theirs[key], (key, ours, theirs)
    for key in ("bytes_down_total", "bytes_up_total", "bytes_per_step"):
        assert deployed["comm"][key] == sim["comm"][key], key


def test_compose_plain_then_tls_matches_the_simulation(engine, simulation, tmp_path):
    engine, build_s = engine
    t0 = time.monotonic()
    sim = simulation
    deployment = ComposeDeployment(tmp_path / "deployment", engine, project=f"fedgan-test-{os.getpid()}")
    summaries = {}
    try:
        deployment.up(tls=False)
        summaries["plain"] = deployment.flwr_run("plain", **RUN)
        assert_matches(summaries["plain"], sim)
        assert deployment.node_volumes(RUN["num_clients"]) == EACH_NODE_ALONE
        deployment.down()
        # TLS + node auth, with secure sums on fresh node volumes, each node verifying its peers'
        # identities (GS-WGAN over TLS runs in test_compose_across_hosts_on_one_engine: one cycle of
        # up, run and down less here, about 140 s of the suite)
        deployment.up(tls=True)
        secure = deployment.flwr_run("tls-secure", **SECURE_RUN)
        assert_matches(secure, simulate(tmp_path / "secure-simulated", SECURE_RUN), SECURE_RUN)
        sums = secure["method"]["dp-merf"]["secure_aggregation"]["sums"]
        assert [(s["inputs"], s["aborted"]) for s in sums] == [(RUN["num_clients"], "")], sums
        deployment.down()
    finally:
        deployment.down()
    assert deployment.leftovers() == ("", "")
    latency = {k: s["step_latency_s"]["median"] for k, s in summaries.items()}
    took = time.monotonic() - t0
    print(f"\ncompose: images {build_s:.0f} s (in the background), test {took:.0f} s; median step {latency} s")


def test_compose_across_hosts_on_one_engine(engine, simulation, tmp_path):
    """docs/deployment/hosts.md with Docker: the server host's project (base + TLS + server overlay,
    superlink and serverapp only) and the node host's docker-compose.nodes.yml as a second project
    with a network of its own, its SuperNodes dialing the server by address with TLS and their own
    registered keys. The run equals the simulation, the nodes share no network with the server, and
    every worker's stream came in through the data plane's published port (Docker relays it from the
    server network's gateway, the address the nodes dial), not from inside the server's network."""
    engine, _ = engine
    hosts = ComposeAcrossHosts(tmp_path / "hosts", engine, project=f"fedgan-hosts-{os.getpid()}")
    try:
        hosts.up()
        summary = hosts.flwr_run("across", **RUN)
        assert_matches(summary, simulation)
        assert hosts.node_volumes(RUN["num_clients"]) == EACH_NODE_ALONE
        nodes = hosts.networks(hosts.nodes_project)
        assert sorted(nodes) == sorted(
            f"{hosts.nodes_project}_{kind}-{i}_1" for kind in ("supernode", "clientapp") for i in range(1, 4)
        )
        assert all(networks == [f"{hosts.nodes_project}_default"] for networks in nodes.values()), nodes
        assert {n for ns in hosts.networks(hosts.project).values() for n in ns} == {f"{hosts.project}_default"}
        peers = re.findall(
            r"data plane: node \d+ connected from ipv4:([\d.]+):\d+ to ([\d.]+):(\d+) \((\w+)\)", hosts.stream
        )
        assert len(peers) == RUN["num_clients"], hosts.stream[-3000:]
        assert set(peers) == {(hosts.server_host, hosts.server_host, hosts.dataplane_port, "TLS")}
    finally:
        hosts.down()
    assert hosts.leftovers() == ("", "")
