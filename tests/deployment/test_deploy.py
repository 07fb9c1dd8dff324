"""Real deployments on this machine: a SuperLink and SuperNodes as processes, runs through `flwr run`.

Slow (a ClientApp process starts per message, ~10 s a step) but they run in CI: the completed
status, ε and bytes equal to the simulation's, TLS + SuperNode auth rejecting an unregistered key
(with each SuperNode in its own network namespace where `ip netns` works), and a SuperNode killed
mid-run.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import json_format

from common.io.private_paths import MARKER
from common.methods import ExperimentConfig
from protos import fedgan_pb2 as pb
from simulations.deploy import netns, pki
from simulations.deploy.local import LocalDeployment
from simulations.deploy.processes import alive, descendants, identity
from simulations.deploy.run import run_on_deployment
from tests.helpers import ROOT, tiny_flags, wait_until

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow
# each test below but test_descendants_finds_a_grandchild starts a deployment of its own
DEPLOYMENT = pytest.mark.usefixtures("one_deployment_at_a_time")

# Uncompressed wire: the deployment and the simulation draw different (cryptographic) noise, and only
# uncompressed messages have sizes that do not depend on the values they carry. The server's client
# sampling is repeated with the testing flag, so both ask the same clients at the same steps.
TINY = tiny_flags(transport=None, synthetic_samples_per_writer=24, wire_compression="none", sampling_seed=1)


def fedgan(*args, timeout=600):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [str(BIN / "fedgan"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def started_pids(run_dir: Path) -> list[int]:
    table = json.loads((run_dir / "deploy" / "processes.json").read_text())
    return [table["superlink"]["pid"]] + [n["pid"] for n in table["supernodes"]]


def assert_all_stopped(pids: list[int]) -> None:
    for pid in pids:
        proc = identity(pid)
        assert proc is None or not alive(proc), f"process {pid} left running"


@DEPLOYMENT
def test_deploy_completes_with_the_simulations_bytes_and_epsilon(tmp_path):
    run_dir = tmp_path / "deployed"
    # Flower's message path: its counters see every message, so they can be checked against ours.
    result = fedgan("deploy", "--local", "--transport", "flower", *TINY, "--steps", "3", "--out", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    dep = summary["deployment"]
    assert summary["status"] == "completed" and summary["transport"] == "flower-run"
    assert dep["flwr_status"] == "finished:completed" and dep["supernodes"] == 3
    for name in ("privacy.json", "metrics.jsonl", "config.json", "checkpoint.pt"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "samples").glob("*.png"))
    assert_all_stopped(started_pids(run_dir))

    sim_dir = tmp_path / "simulated"
    result = fedgan("simulate", "--transport", "inprocess", *TINY, "--steps", "3", "--out", str(sim_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    sim = json.loads((sim_dir / "summary.json").read_text())
    for deployed, simulated in zip(summary["clients"], sim["clients"], strict=False):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert deployed[key] == simulated[key], key
    for key in ("bytes_down_total", "bytes_up_total", "envelope_bytes_down_total", "bytes_per_step"):
        assert summary["comm"][key] == sim["comm"][key], key

    # Flower's counters see our messages plus the Fleet API's own request/response fields: a few %.
    for way in ("down", "up"):
        counted, flower = dep["counted_bytes"][way], dep["superlink_traffic_bytes"][way]
        assert counted <= flower <= 1.1 * counted, (way, counted, flower)
        assert dep["wire_bytes"][way] > flower  # HTTP headers, idle polls, the app bundle
    assert summary["step_latency_s"]["steps"] == 3 and summary["step_latency_s"]["median"] > 0
    json_format.ParseDict(summary, pb.RunSummary())  # the deployment section is part of the schema


@DEPLOYMENT
def test_tls_and_auth_reject_an_unregistered_supernode(tmp_path):
    """Registered nodes connect and run; a node with an unregistered key is refused. Where namespaces
    can be made, every SuperNode runs in its own, so the traffic crosses veth interfaces."""
    use_netns = netns.available()
    with LocalDeployment(tmp_path / "run" / "deploy", 3, tls=True, auth=True, use_netns=use_netns) as dep:
        rogue_key = pki.make_node_key(dep.workdir / "keys", "rogue")
        rogue = dep.start_supernode(3, key=rogue_key, partition=0, name="rogue")
        assert rogue.proc.wait(timeout=90) != 0
        assert "Failed to activate SuperNode" in rogue.log.read_text()
        nodes = dep.flwr("supernode", "list", "fedgan-local", "--format", "json")["nodes"]
        assert len(nodes) == 3

        cfg = ExperimentConfig(
            num_clients=3,
            steps=2,
            model="tiny",
            batch_size=8,
            n_critic=1,
            dataplane="grpc",
            synthetic_samples_per_writer=24,
            eval=False,
            progress=False,
            out=str(tmp_path / "run"),
            data_dir=str(tmp_path / "data"),
        )
        assert run_on_deployment(dep, cfg) == 0
        pids = [p.pid for p in dep.started]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["transport"] == "flower-run+grpc-dataplane"  # the data plane, over TLS (and veth)
    assert summary["deployment"]["tls"] and summary["deployment"]["auth"]
    assert summary["deployment"]["flwr_status"] == "finished:completed"
    assert [c["queries"] for c in summary["clients"]] and sum(c["queries"] for c in summary["clients"]) == 2
    private = ["clients", "deploy/nodes", "deploy/keys", "deploy/certs", *(f"deploy/nodes/{i}/state" for i in range(3))]
    for folder in private:  # issue 23, item 18: raw partitions, discriminators and private keys say so
        assert (tmp_path / "run" / folder / MARKER).is_file(), folder
    if use_netns:
        assert all(n.host is not None for n in dep.nodes)
        assert not [h for h in netns_list() if h.startswith(dep.namespaces.tag)]
    assert_all_stopped(pids)


def netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@DEPLOYMENT
def test_a_supernode_killed_mid_run_is_dropped_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    args = [
        str(BIN / "fedgan"),
        "deploy",
        "--local",
        "--transport",
        "flower",
        *TINY,
        "--steps",
        "2",  # the kill follows step 1; step 2 finds the node dead
        "--clients-per-step",
        "3",
        # a step on Flower's message path takes ~10 s (a ClientApp process per message): 3.5× that
        "--reply-timeout-s",
        "35",
        "--log-every",
        "1",
        "--out",
        str(run_dir),
    ]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        victim = _wait_for_first_step(run_dir, proc)
        os.killpg(victim, signal.SIGKILL)  # the SuperNode and the processes it started
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    assert summary["failed_clients"] == [1]
    clients = {c["client_id"]: c for c in summary["clients"]}
    assert clients[1]["status"] == "failed"
    assert "no reply" in clients[1]["failure"] or "unavailable" in clients[1]["failure"], clients[1]
    assert clients[0]["queries"] == clients[2]["queries"] == 2
    assert 1 <= clients[1]["queries"] <= 2  # the query that found it dead stays charged (sent, maybe answered)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]  # nothing written was lost
    assert_all_stopped(started_pids(run_dir))


def _wait_for_first_step(run_dir: Path, proc: subprocess.Popen) -> int:
    """The pid of SuperNode 1 once the run has completed its first step."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        try:
            if json.loads((run_dir / "progress.json").read_text())["step"] >= 1:
                table = json.loads((run_dir / "deploy" / "processes.json").read_text())
                return table["supernodes"][1]["pid"]
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError("the run did not finish its first step in time")


def test_descendants_finds_a_grandchild():
    proc = subprocess.Popen(["bash", "-c", "sleep 30 & wait"], start_new_session=True)
    try:

        def grandchild():
            return any(
                Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep") for pid, _ in descendants([proc.pid])
            )

        wait_until(grandchild, timeout_s=30, what="bash starting its sleep")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@DEPLOYMENT
def test_supernodes_pinning_a_policy_refuse_a_server_asking_for_less(tmp_path):
    """Each SuperNode pins its policy in its node config (`--node-policy`): a server that asks for
    less noise than the nodes' minimum is refused at the hello, before anything is released, and
    `fedgan deploy` ends with a message naming the nodes and the reason. Through the gRPC data plane
    with a 3 s reply timeout: it used to be the workers' start-up timeout too, and start-up failed
    (issue 14, item 8)."""
    policy = tmp_path / "policy.toml"
    policy.write_text("min-noise-multiplier = 1.0\nmax-epsilon = 100\n")
    run_dir = tmp_path / "refused"
    result = fedgan(
        "deploy",
        "--local",
        "--reply-timeout-s",
        "3",
        *TINY,
        "--num-clients",
        "2",
        "--steps",
        "2",
        "--noise-multiplier",
        "0.5",
        "--node-policy",
        str(policy),
        "--out",
        str(run_dir),
    )
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 of 2 nodes refuse this run" in result.stderr
    # each answer's own multiplier, σ/√B = 0.5/√8
    assert "noise multiplier 0.176777 of each release is below the node's minimum 1" in result.stderr
    assert str(policy) in result.stderr
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob("deploy/nodes/*/state/client-*.pt"))
    assert_all_stopped(started_pids(run_dir))


@DEPLOYMENT
def test_a_secure_sum_runs_over_the_deployments_data_plane_as_in_the_simulation(tmp_path):
    """DP-MERF through a secure sum in a real local deployment: SuperLink, three SuperNodes with the
    identities `deploy --local` provisions, and the four rounds over the data plane's streams, each
    node's secrets in its worker's persistent Context; its bytes and ε equal the simulation's."""
    run_dir = tmp_path / "secure"
    flags = ["--strategy", "dp-merf", "--merf-features", "20", "--secure-aggregation", "--secagg-cohort", "3"]
    result = fedgan("deploy", "--local", *TINY, *flags, "--steps", "2", "--out", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["deployment"]["supernodes"] == 3
    sums = summary["method"]["dp-merf"]["secure_aggregation"]["sums"]
    assert [(s["inputs"], s["aborted"]) for s in sums] == [(3, "")]
    assert summary["epsilon_amplified"]["kind"] == "per client, server deviates from the secure sum"
    assert all((run_dir / "deploy" / "nodes" / str(i) / "state" / "secagg-peers.json").is_file() for i in range(3))

    sim_dir = tmp_path / "simulated"
    result = fedgan("simulate", "--transport", "inprocess", *TINY, *flags, "--steps", "2", "--out", str(sim_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    sim = json.loads((sim_dir / "summary.json").read_text())
    for deployed, simulated in zip(summary["clients"], sim["clients"], strict=True):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert deployed[key] == simulated[key], (key, deployed[key], simulated[key])
    for key in ("bytes_down_total", "bytes_up_total", "bytes_per_step"):
        assert summary["comm"][key] == sim["comm"][key], key
    assert summary["epsilon_amplified"]["epsilon"] == sim["epsilon_amplified"]["epsilon"]
