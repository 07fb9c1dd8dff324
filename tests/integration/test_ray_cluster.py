"""``fedgan simulate --ray-address`` on a real two-node Ray cluster started on this machine.

The cluster (``tests/ray_cluster.py``) runs as descendants of this test's process, and the CLI runs in
this process too: the local run's reaper watches this process's descendants, so it must spare the
cluster (it ran before the watch began), and the cluster run must not touch it at all. Then the same
run goes through the cluster: ClientApp actors on both nodes (Ray's GCS actor table), results equal
to the local run's (same seeds), and the cluster still alive and running tasks on both nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from simulations.cli import main
from tests.helpers import tiny_flags
from tests.ray_cluster import two_node_cluster

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_deployment_at_a_time")]

# Two clients a step in two actors: every step needs both of the cluster's one-CPU nodes at once.
# A fixed noise seed (allowed by the nodes' policy, which must reach the cluster's actors) and
# sampling seed make the two runs comparable; uncompressed messages have value-independent sizes.
RUN = dict(
    transport="flower",
    steps=3,
    clients_per_step=2,
    parallel_clients=2,
    noise_seed=5,
    sampling_seed=3,
    wire_compression="none",
)


def _cluster_after_the_run(address: str) -> tuple[set[str], list[dict], set[str]]:
    """(live node ids, the ClientApp actors of the GCS actor table, the nodes a fresh task ran on)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False)
    try:
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        # The GCS's actor table, dead actors included (ray.util.state reads it through the dashboard,
        # which this cluster does not run).
        actors = [a for a in ray._private.state.actors().values() if a["ActorClassName"] == "ClientAppActor"]

        @ray.remote(num_cpus=1)
        def node_id() -> str:
            return ray.get_runtime_context().get_node_id()

        on = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
        ran = set(ray.get([node_id.options(scheduling_strategy=s).remote() for s in on], timeout=120))
    finally:
        ray.shutdown()
    return nodes, actors, ran


def _generator(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    return state["strategy"]["generator"]["ema"]["module"]


def test_a_simulation_on_a_two_node_cluster_equals_the_local_run(tmp_path, monkeypatch):
    policy = tmp_path / "allow-nonprivate.toml"
    policy.write_text("allow-nonprivate = true\n")
    flags = [*tiny_flags(**RUN), "--node-policy", str(policy)]
    local, remote = tmp_path / "local", tmp_path / "cluster"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with two_node_cluster() as cluster:
        assert main(["simulate", *flags, "--out", str(local)]) == 0
        # auto: the cluster `ray start --head` recorded in $RAY_TMPDIR/ray, as on a user's head node
        monkeypatch.setenv("RAY_TMPDIR", str(cluster.base))
        assert main(["simulate", *flags, "--ray-address", "auto", "--out", str(remote)]) == 0, cluster.logs()
        monkeypatch.delenv("RAY_TMPDIR")
        assert all(p.poll() is None for p in cluster.started), cluster.logs()
        nodes, actors, ran = _cluster_after_the_run(cluster.address)
    assert len(nodes) == 2 and ran == nodes  # both nodes alive and running tasks after both runs
    assert {a["Address"]["NodeID"] for a in actors} == nodes, actors  # ClientApp actors on both nodes
    assert len({a["JobID"] for a in actors}) == 1 and len(actors) == 2  # one run's pool: one per node

    assert json.loads((remote / "config.json").read_text())["ray_address"] == "auto"
    # the nodes kept their state and ledgers in the run's clients/ (FEDGAN_NODE_STATE reached the actors)
    ledgers = sorted(path.name for path in (remote / "clients").glob("node-ledger-*.json"))
    assert ledgers == [f"node-ledger-{i:05d}.json" for i in range(3)]
    a, b = (json.loads((run / "summary.json").read_text()) for run in (local, remote))
    assert a["status"] == b["status"] == "completed" and a["steps_completed"] == b["steps_completed"] == 3
    for mine, theirs in zip(a["clients"], b["clients"], strict=True):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert mine[key] == theirs[key], key
    assert sum(c["queries"] for c in b["clients"]) == 3 * 2
    for key in ("bytes_down_total", "bytes_up_total", "bytes_per_step"):
        assert a["comm"][key] == b["comm"][key], key
    g_local, g_cluster = _generator(local), _generator(remote)
    assert g_local.keys() == g_cluster.keys()
    for key, value in g_local.items():
        assert torch.equal(value, g_cluster[key]), key
