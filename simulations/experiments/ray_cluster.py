"""Where Flower's simulation runs its ClientApp actors: a fresh local Ray instance, or an existing cluster.

Flower's simulation runs each ClientApp in a Ray actor, and Ray spans machines. With ``ray_address``
(``auto`` or the GCS's ``HOST:PORT``) this process joins an existing cluster as a driver instead of
starting a Ray instance of its own, and Ray places the actors on the cluster's nodes. What changes:

- Resources. A local instance has this machine's cores; on a cluster this machine's core count means
  nothing, so each actor reserves ``ray_actor_cpus`` cores (automatic: the instance's cores divided by
  ``parallel_clients``, at most one node's), checked against the nodes before anything starts.
- ``ray.init``. A driver joining a cluster may not size it (Ray refuses num_cpus, the dashboard, ...),
  and the actors do not inherit this process's environment: the import path and the variables the
  simulated nodes read (FEDGAN_NODE_STATE, FEDGAN_NODE_POLICY, ...) travel in the job's runtime_env.
- The reaper. This process starts no Ray process when it joins a cluster, so no reaper runs (a cluster
  it did not start is never its to end); Ray ends the run's actors itself when the driver exits,
  however it exits (measured: after a SIGKILL of the driver, its actors were DEAD within 3 s).
- Reachability. ``ray.init`` retries an unreachable or silent address for minutes; a TCP connect and
  a probe in a child process with a deadline (``CONNECT_TIMEOUT_S``) answer first, naming the option.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.options import ConfigError

CONNECT_TIMEOUT_S = 30.0  # the TCP connect and the probe together; ray.init alone retries for minutes
TCP_TIMEOUT_S = 5.0
ROOT = Path(__file__).resolve().parents[2]
RAY_ADDRESS_ENV = "RAY_ADDRESS"


class RayClusterError(ConfigError):
    """The cluster named by ``ray_address`` cannot be used (or ``ray_actor_cpus`` does not fit it)."""


def ray_address_file(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``ray start --head`` records the cluster it started (Ray's default temp dir, as Ray's own
    ``get_ray_address_file(None)`` computes it: $RAY_TMPDIR, else $TMPDIR, else /tmp, then ray/)."""
    base = environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def resolve_address(address: str, environ: Mapping[str, str] = os.environ) -> str:
    """``ray_address`` as HOST:PORT: ``auto`` is $RAY_ADDRESS, else the cluster ``ray start --head`` last
    recorded on this machine. Unlike Ray's own ``auto``, never any Ray instance found running here:
    that may be another run's private one. What either holds is checked as the option itself is, and
    a bad value is a RayClusterError naming where it came from."""
    if address != "auto":
        return address
    from_env = environ.get(RAY_ADDRESS_ENV, "").strip()
    if from_env and from_env != "auto":
        return _checked(from_env, f"${RAY_ADDRESS_ENV} (read for ray_address='auto')")
    path = ray_address_file(environ)
    recorded = _recorded_address(path)
    if not recorded:
        raise RayClusterError(
            f"invalid ray_address='auto': no Ray cluster recorded on this machine (${RAY_ADDRESS_ENV} is not set "
            f"and {path} does not exist); start one with `ray start --head` or give its address as HOST:PORT"
        )
    return _checked(recorded, f"{path} (the cluster `ray start --head` recorded, read for ray_address='auto')")


def _recorded_address(path: Path) -> str:
    """What ``ray start --head`` recorded in ``path`` ("" when nothing is there)."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    except UnicodeDecodeError as err:
        raise RayClusterError(
            f"invalid ray_address='auto': {path}, the cluster `ray start --head` recorded, is not text "
            f"({err.reason} at byte {err.start}); start the cluster again or give its address as HOST:PORT"
        ) from None


def _checked(address: str, source: str) -> str:
    """``address``, read from ``source``, if it is a GCS address (HOST:PORT); a RayClusterError naming both if not."""
    from common.io.net import ray_address_problem, shown_address

    problem = ray_address_problem(address)
    if problem or address == "auto":
        raise RayClusterError(
            f"{source} holds {shown_address(address)!r}: {problem or 'not an address'}; fix it, or give the "
            "cluster's address as ray_address HOST:PORT"
        )
    return address


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float | None = None) -> list[float]:
    """The CPUs of each live node of the cluster whose GCS is ``address`` (HOST:PORT), within
    ``timeout_s`` (default ``CONNECT_TIMEOUT_S``), or a RayClusterError naming ray_address and what failed."""
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=min(TCP_TIMEOUT_S, timeout_s)).close()
    except (OSError, UnicodeError) as err:  # UnicodeError: a name the resolver's IDNA codec refuses
        raise RayClusterError(
            f"invalid ray_address={address!r}: cannot connect to it ({err}); is a Ray cluster running there? "
            "Start one with `ray start --head` and give the address it prints"
        ) from None
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, address],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=max(1.0, deadline - time.monotonic()),
        )
    except subprocess.TimeoutExpired:
        raise RayClusterError(
            f"invalid ray_address={address!r}: something listens there but no Ray cluster answered within "
            f"{timeout_s:g} s; give the GCS address `ray start --head` printed (port 6379 by default), not the "
            "dashboard's or Ray Client's"
        ) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RayClusterError(f"invalid ray_address={address!r}: joining the cluster failed: {reason}")
    return [float(cpus) for cpus in json.loads(lines[-1])]


def actor_cpus_for(node_cpus: Sequence[float], requested: int, parallel: int) -> int:
    """Cores each ClientApp actor reserves on a Ray instance whose nodes have ``node_cpus`` cores:
    ``requested`` (ray_actor_cpus) when set, else the instance's cores / ``parallel`` (so that many
    actors compute side by side), at most one node's cores. An actor must fit on one node."""
    largest = int(max(node_cpus, default=0))
    if largest < 1:
        raise RayClusterError("the Ray instance has no node with a CPU to run ClientApp actors on")
    if requested:
        if requested > largest:
            raise RayClusterError(
                f"invalid ray_actor_cpus={requested}: no node of the Ray instance has that many cores "
                f"(its nodes have {', '.join(f'{c:g}' for c in node_cpus)}); each ClientApp actor runs on one node"
            )
        return requested
    return max(1, min(largest, int(sum(node_cpus)) // max(1, parallel)))


def actor_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the actors on a cluster need of this process's environment: the import path Flower gives
    a local instance's actors (this process's sys.path), and the project's own variables."""
    paths = [p or os.getcwd() for p in sys.path]
    if environ.get("PYTHONPATH"):
        paths.append(environ["PYTHONPATH"])
    own = {k: v for k, v in environ.items() if k.startswith("FEDGAN_")}
    return {"PYTHONPATH": os.pathsep.join(paths), **own}


def check_placement(address: str, actor_cpus: int, parallel: int) -> int:
    """Before any work: the cores each actor will reserve, or a RayClusterError naming the option
    (an unreachable cluster, an actor that fits on no node)."""
    if not address:
        return actor_cpus_for([os.cpu_count() or 1], actor_cpus, parallel)
    return actor_cpus_for(probe(resolve_address(address)), actor_cpus, parallel)


@contextmanager
def ray_backend(address: str, actor_cpus: int, parallel: int) -> Iterator[dict[str, Any]]:
    """For one ``run_simulation``: Flower's backend config, with Ray ready for it.

    ``address`` empty: a fresh local instance of our own, started by Flower (``"address": "local"``,
    never one a killed run left behind, which ``ray.init()`` would otherwise join), watched by the
    reaper. Else the cluster, joined here (Flower then finds Ray initialized and leaves it as it is)."""
    if not address:
        from .reaper import watch

        cpus = os.cpu_count() or 1
        resources = {"num_cpus": actor_cpus_for([cpus], actor_cpus, parallel), "num_gpus": 0.0}
        init = {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": True, "address": "local"}
        with watch():
            yield {"client_resources": resources, "init_args": init}
        return
    resolved = resolve_address(address)
    per_actor = actor_cpus_for(probe(resolved), actor_cpus, parallel)
    with joined(resolved):
        yield {"client_resources": {"num_cpus": per_actor, "num_gpus": 0.0}}


@contextmanager
def joined(address: str) -> Iterator[None]:
    """This process as a driver of the cluster at ``address`` for the block; only what Ray allows a
    driver that joins a cluster (no sizes, no dashboard). Leaving disconnects; the cluster stays."""
    import ray

    ray.init(address=address, runtime_env={"env_vars": actor_env()}, log_to_driver=True)
    try:
        yield
    finally:
        if ray.is_initialized():  # Flower's backend shuts Ray down when the simulation ends
            ray.shutdown()


def _probe_main(address: str) -> int:
    """The probe's child process: join, print the live nodes' CPUs as JSON, leave."""
    import logging

    import ray

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        print(json.dumps([n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]]), flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(_probe_main(sys.argv[1]))
