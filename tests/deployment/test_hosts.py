"""SuperNodes on hosts of their own: docs/deployment/hosts.md's recipe on one machine.

Each SuperNode runs in its own network namespace, plugged into the server's bridge (netns.py), so it
dials the SuperLink and the ServerApp's data plane at the server's address, which is not loopback,
from an address of its own; TLS and SuperNode authentication are on, and the data plane is bound to
and advertised at that address (run config dataplane-bind / dataplane-address). The same run on the
loopback deployment (`fedgan deploy --local --tls --auth`), run at the same time in the same test,
must give the same per-client bytes and ε. The step latency of the pair is a measurement, printed
here and benchmarked in bench/hosts_latency.py (issue 25's 1.2x); it is not asserted, since a
test's timing on 2 shared cores says more about the neighbours than the code. Skipped, with the
reason, where namespaces cannot be made (not root, no `ip`).
"""

from __future__ import annotations

import pytest

from simulations.deploy import netns
from simulations.deploy.side_by_side import latency_ratio, run_side_by_side, short_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_deployment_at_a_time"),
    pytest.mark.skipif(not netns.available(), reason="network namespaces need root and iproute2's `ip`"),
]
NODES = 3
STEPS = 60


def test_supernodes_on_hosts_of_their_own_match_the_loopback_deployment(tmp_path):
    runs = run_side_by_side(tmp_path, NODES, lambda name: short_run(tmp_path, name, NODES, STEPS))
    loopback, hosts = runs["loopback"], runs["hosts"]
    for d in (loopback, hosts):
        assert d.summary["status"] == "completed" and d.summary["steps_completed"] == STEPS
        assert d.summary["transport"] == "flower-run+grpc-dataplane"
        assert d.summary["deployment"]["tls"] and d.summary["deployment"]["auth"]
        assert d.summary["deployment"]["flwr_status"] == "finished:completed"

    # The crossing, seen from both ends: every worker's stream (in the ServerApp's log) and every
    # SuperNode's connection to the SuperLink (at its relay) came from that node's own address, to
    # the server's, over TLS; on loopback the same log says 127.0.0.1, so the check can tell. An
    # extra relay hop or a detour through loopback shows here as a wrong peer, not as latency.
    assert not hosts.server_host.startswith("127.")
    assert len(set(hosts.node_addresses)) == NODES and not any(a.startswith("127.") for a in hosts.node_addresses)
    assert sorted(p[0] for p in hosts.dataplane_peers) == sorted(hosts.node_addresses)
    assert {(p[1], p[2]) for p in hosts.dataplane_peers} == {(hosts.server_host, "TLS")}
    assert hosts.relay_peers == [{a} for a in hosts.node_addresses]
    assert {p[0] for p in loopback.dataplane_peers} == {"127.0.0.1"} and len(loopback.dataplane_peers) == NODES

    # Same run, same bytes and ε: the namespaces change where packets go, not what is sent.
    for ours, theirs in zip(hosts.summary["clients"], loopback.summary["clients"], strict=True):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert ours[key] == theirs[key], (key, ours, theirs)
    for key in ("bytes_down_total", "bytes_up_total", "bytes_per_step"):
        assert hosts.summary["comm"][key] == loopback.summary["comm"][key], key

    # Every step of both runs recorded its wall time (what the benchmark reads); printed, not bounded.
    for d in (hosts, loopback):
        assert d.summary["step_latency_s"]["steps"] == STEPS
    lat = latency_ratio(runs)
    print(
        f"\nmedian step latency over {STEPS} steps: namespaces {lat['hosts_median_s']:.3f} s, "
        f"loopback {lat['loopback_median_s']:.3f} s; ratio {lat['ratio']:.2f} (bench/hosts_latency.py measures it)"
    )
