"""``ray_address`` and ``ray_actor_cpus``: the option's checks, ``auto``, the cores per actor, what the
cluster's actors get of this process's environment, and a bounded, named refusal of an address that
does not answer (the real two-node cluster: tests/integration/test_ray_cluster.py)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from common.methods import ExperimentConfig
from common.options import ConfigError
from simulations.cli import main
from simulations.experiments import ray_cluster
from simulations.experiments.ray_cluster import (
    RayClusterError,
    actor_cpus_for,
    actor_env,
    ray_address_file,
    resolve_address,
)
from simulations.experiments.simulate import actor_cpus
from tests.helpers import tiny_flags


@pytest.mark.parametrize("address", ["", "auto", "10.0.0.5:6379", "head.example:6379", "[::1]:6379"])
def test_addresses_the_option_takes(address):
    assert ExperimentConfig.from_mapping({"ray_address": address}, source="test").ray_address == address


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("ray://10.0.0.5:10001", "Ray Client"),
        ("10.0.0.5", "HOST:PORT"),
        ("10.0.0.5:0", "HOST:PORT"),
        ("10.0.0.5:port", "HOST:PORT"),
        (":6379", "HOST:PORT"),
        ("local", "HOST:PORT"),
    ],
)
def test_addresses_the_option_refuses(address, why):
    with pytest.raises(ConfigError, match="ray_address") as err:
        ExperimentConfig.from_mapping({"ray_address": address}, source="test")
    assert why in str(err.value)


def test_actor_cpus_is_validated():
    with pytest.raises(ConfigError, match="ray_actor_cpus"):
        ExperimentConfig.from_mapping({"ray_actor_cpus": -1}, source="test")


def test_auto_is_ray_address_then_what_ray_start_recorded(tmp_path):
    recorded = tmp_path / "ray" / "ray_current_cluster"
    recorded.parent.mkdir()
    recorded.write_text("10.0.0.5:6379\n")
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert resolve_address("auto", env) == "10.0.0.5:6379"
    assert resolve_address("auto", {**env, "RAY_ADDRESS": "10.0.0.9:7000"}) == "10.0.0.9:7000"
    assert resolve_address("10.0.0.7:6379", {**env, "RAY_ADDRESS": "10.0.0.9:7000"}) == "10.0.0.7:6379"
    recorded.unlink()
    with pytest.raises(RayClusterError, match="ray_address='auto'") as err:
        resolve_address("auto", env)
    assert str(recorded) in str(err.value) and "ray start --head" in str(err.value)


@pytest.mark.parametrize("env", [{"RAY_TMPDIR": "/x/rt"}, {"TMPDIR": "/x/t"}, {}])
def test_the_recorded_cluster_is_where_ray_itself_looks(env, monkeypatch):
    """``auto`` reads the file ``ray start --head`` writes: the path Ray computes, not a copy that drifts."""
    from ray._common.utils import get_ray_address_file

    for name in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ray_address_file(os.environ) == ray_address_file(env) == Path(get_ray_address_file(None))


def test_cores_per_actor():
    # automatic: the instance's cores / parallel clients, at most one node's (an actor lives on one node)
    assert [actor_cpus_for([2.0, 2.0], 0, p) for p in (1, 2, 4, 8)] == [2, 2, 1, 1]
    assert actor_cpus_for([16.0, 4.0], 0, 2) == 10 and actor_cpus_for([16.0, 4.0], 0, 1) == 16
    assert actor_cpus_for([1.0, 1.0], 0, 2) == 1
    assert actor_cpus_for([8.0, 4.0], 3, 1) == 3
    with pytest.raises(RayClusterError, match="ray_actor_cpus=9") as err:
        actor_cpus_for([8.0, 4.0], 9, 1)
    assert "8, 4" in str(err.value)
    with pytest.raises(RayClusterError, match="no node with a CPU"):
        actor_cpus_for([0.0], 0, 1)
    # a local instance is one node of this machine's cores: the rule it always had
    assert [actor_cpus(16, p) for p in (1, 2, 3, 16, 64)] == [actor_cpus_for([16.0], 0, p) for p in (1, 2, 3, 16, 64)]


def test_a_local_actor_larger_than_this_machine_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    too_many = (os.cpu_count() or 1) + 1
    flags = tiny_flags(transport="flower", ray_actor_cpus=too_many)
    assert main(["simulate", *flags, "--out", str(out)]) == 2
    assert f"ray_actor_cpus={too_many}" in capsys.readouterr().err and not out.exists()


def test_the_cluster_actors_get_the_import_path_and_the_nodes_variables():
    env = actor_env({"FEDGAN_NODE_STATE": "/shared/run/clients", "FEDGAN_NODE_POLICY": "/p.toml", "HOME": "/h"})
    assert env["FEDGAN_NODE_STATE"] == "/shared/run/clients" and env["FEDGAN_NODE_POLICY"] == "/p.toml"
    assert "HOME" not in env
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert "" not in paths and all(p in paths for p in sys.path if p)
    assert any(os.path.exists(os.path.join(p, "simulations", "experiments", "ray_cluster.py")) for p in paths)


def test_an_address_nobody_answers_is_refused_in_bounded_time(tmp_path, capsys, monkeypatch):
    """A closed port, and one that accepts but never answers (not a Ray GCS), are refused before any
    work, naming ray_address, in bounded time (ray.init alone retries such addresses for minutes)."""
    monkeypatch.setattr(ray_cluster, "CONNECT_TIMEOUT_S", 8.0)
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never speaks
    closed = socket.create_server(("127.0.0.1", 0))
    closed_address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    cases = ((closed_address, "cannot connect"), (f"127.0.0.1:{silent.getsockname()[1]}", "no Ray cluster answered"))
    try:
        for address, why in cases:
            out = tmp_path / address.replace(":", "_")
            started = time.monotonic()
            code = main(["simulate", *tiny_flags(transport="flower"), "--ray-address", address, "--out", str(out)])
            err = capsys.readouterr().err
            assert code == 2 and f"ray_address={address!r}" in err and why in err, err
            assert time.monotonic() - started < 30
            assert not out.exists()
    finally:
        silent.close()
