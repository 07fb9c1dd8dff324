"""Two local TLS + auth deployments run at the same time: SuperNodes on loopback and on hosts of their own.

The recipe of docs/deployment/hosts.md on one machine: one deployment's SuperNodes live in network
namespaces of their own (netns.py) and dial the server's bridge address; the other's dial loopback.
Both runs go at once so the machine's other load weighs on both alike (one after the other it does
not). ``tests/deployment/test_hosts.py`` checks what each observed (peers, bytes, ε);
``bench/hosts_latency.py`` measures their step latency. Shared here so both read the same runs.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common.methods import ExperimentConfig
from simulations.deploy.local import LocalDeployment
from simulations.deploy.run import SERVERAPP_LOG, run_on_deployment

ARMS = {"loopback": False, "hosts": True}  # name -> SuperNodes in namespaces of their own
# "data plane: node N connected from ipv4:ADDR:PORT to HOST:PORT (TLS)", one line per worker
CONNECTED = re.compile(r"data plane: node (\d+) connected from ipv4:([\d.]+):\d+ to ([\d.]+):\d+ \((TLS|plaintext)\)")


class SideBySideError(RuntimeError):
    """A deployment's run failed or left namespaces behind; the message carries the ServerApp log's tail."""


@dataclass
class Deployed:
    summary: dict
    server_host: str
    node_addresses: list[str]  # each SuperNode's own address (127.0.0.1 on loopback)
    relay_peers: list[set[str]]  # where each node's SuperLink connections came from
    dataplane_peers: list[tuple[str, str, str]]  # (from, to, security) of each worker's stream


def short_run(base: Path, name: str, nodes: int, steps: int, model: str = "tiny") -> ExperimentConfig:
    """One short GS-WGAN run through the gRPC data plane, written to ``base/name``.

    Sizes independent of the values sent, and the server's sampling repeated (testing flag), so that
    both deployments ask the same clients at the same steps and their bytes and ε must be equal.
    """
    return ExperimentConfig(
        num_clients=nodes, steps=steps, model=model, batch_size=8, n_critic=1, dataplane="grpc",
        synthetic_samples_per_writer=24, wire_compression="none", sampling_seed=1, sample_every=10**6,
        checkpoint_every=10**6, eval=False, progress=False, out=str(base / name), data_dir=str(base / "data"),
    )  # fmt: skip


def run_side_by_side(base: Path, nodes: int, config_for: Callable[[str], ExperimentConfig]) -> dict[str, Deployed]:
    """Start both deployments under ``base``, run ``config_for(arm)`` on each at once, read what they saw."""
    cfgs = {name: config_for(name) for name in ARMS}
    with contextlib.ExitStack() as stack:
        deps = {
            name: stack.enter_context(
                LocalDeployment(base / name / "deploy", nodes, tls=True, auth=True, use_netns=use_netns)
            )
            for name, use_netns in ARMS.items()
        }
        with ThreadPoolExecutor(len(deps)) as pool:
            futures = {n: pool.submit(run_on_deployment, dep, cfgs[n]) for n, dep in deps.items()}
            codes = {n: f.result() for n, f in futures.items()}
        for name, code in codes.items():
            if code != 0:
                tail = (deps[name].workdir / SERVERAPP_LOG).read_text()[-3000:]
                raise SideBySideError(f"the {name} deployment's run exited {code}:\n{tail}")
        results = {name: observed(dep, Path(cfgs[name].out)) for name, dep in deps.items()}
        tags = [dep.namespaces.tag for dep in deps.values() if dep.namespaces is not None]
    left = [n for n in netns_names() for tag in tags if n.startswith(tag)]
    if left:
        raise SideBySideError(f"namespaces left behind: {left}")
    return results


def observed(dep: LocalDeployment, run: Path) -> Deployed:
    """What one deployment's run recorded and what its ServerApp and relays saw."""
    log = (dep.workdir / SERVERAPP_LOG).read_text()
    return Deployed(
        summary=json.loads((run / "summary.json").read_text()),
        server_host=dep.server_host,
        node_addresses=[n.host.node_ip if n.host else "127.0.0.1" for n in dep.nodes],
        relay_peers=[set(n.relay.peers) for n in dep.nodes],
        dataplane_peers=[m.group(2, 3, 4) for m in CONNECTED.finditer(log)],
    )


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def latency_ratio(runs: dict[str, Deployed]) -> dict[str, float]:
    """Median and p90 step latency of each arm (step_latency_s: wall time per generator step) and their ratio."""
    ns, lo = (runs[a].summary["step_latency_s"] for a in ("hosts", "loopback"))
    return {
        "hosts_median_s": ns["median"],
        "hosts_p90_s": ns["p90"],
        "loopback_median_s": lo["median"],
        "loopback_p90_s": lo["p90"],
        "ratio": ns["median"] / lo["median"],
    }
