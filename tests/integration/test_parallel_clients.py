"""``parallel_clients``: with m > 1 clients per step, Flower's simulation computes them side by side in
separate ClientApp actors (issue 12 §1: the step time must grow far less than m), each with its share of
the cores; nothing else about the run changes."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from client.app import app as client_app
from simulations.experiments.simulate import actor_cpus
from tests.integration.test_loop_inprocess import cfg_for

HOLD_S = 0.4  # each answer takes at least this long, so two answers of a step overlap only if parallel


def _calls_logged_to(folder):
    """The project's ClientApp, recording each GS-WGAN answer's process, threads and time window."""

    def app(message, context):
        start = time.monotonic()
        reply = client_app(message, context)
        if message.metadata.message_type == "train.gswgan":
            import torch

            time.sleep(max(0.0, HOLD_S - (time.monotonic() - start)))
            record = {"pid": os.getpid(), "threads": torch.get_num_threads(), "start": start, "end": time.monotonic()}
            (folder / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
        return reply

    return app


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two actors side by side need two cores")
def test_two_parallel_clients_answer_side_by_side_in_two_actors(tmp_path, monkeypatch):
    from server.reporting import RunDirectory
    from simulations.experiments.simulate import _experiment_fn, run_on_transport

    for name in ("FEDGAN_CLIENT_THREADS", "OMP_NUM_THREADS"):  # the suite pins them; Ray sets each actor's own
        monkeypatch.delenv(name, raising=False)
    calls = tmp_path / "calls"
    calls.mkdir()
    cfg = cfg_for(tmp_path, steps=4, num_clients=4, clients_per_step=2, parallel_clients=2)
    run = RunDirectory.create(cfg)
    summary, error = run_on_transport(
        4,
        _experiment_fn(cfg, run, False, None, "flower-simulation"),
        "flower",
        client_app=_calls_logged_to(calls),
        parallel=cfg.parallel_clients,
        node_state=run.state_dir,
    )
    assert error is None, error
    assert summary["status"] == "completed" and sum(c["queries"] for c in summary["clients"]) == 8
    records = [json.loads(p.read_text()) for p in calls.iterdir()]
    assert len(records) == 8
    assert len({r["pid"] for r in records}) == 2, "the answers came from one actor"
    assert {r["threads"] for r in records} == {actor_cpus(os.cpu_count() or 1, 2)}
    overlapping = sum(
        a["start"] < b["end"] and b["start"] < a["end"] for i, a in enumerate(records) for b in records[i + 1 :]
    )
    assert overlapping >= 2, f"only {overlapping} pairs of answers overlapped in time over 4 steps of 2 clients"


def test_each_actor_reserves_its_share_of_the_cores():
    assert [actor_cpus(16, p) for p in (1, 2, 3, 16, 64)] == [16, 8, 5, 1, 1]
    assert actor_cpus(2, 1) == 2 and actor_cpus(1, 4) == 1


def test_parallel_clients_is_validated():
    from common.config import ConfigError
    from common.methods import ExperimentConfig

    for bad in (0, 257):
        with pytest.raises(ConfigError, match="parallel_clients"):
            ExperimentConfig.from_mapping({"parallel_clients": bad}, source="test")
