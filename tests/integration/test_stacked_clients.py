"""m clients per step through the in-process transport: the stacked critic phase (``stack_clients``)
gives the run the stepped-one-by-one run gives: the same clients asked, the same ledgers and bytes,
and a released generator equal up to float rounding; a node that breaks fails alone."""

import pytest
import torch
from flwr.app import Message

from client.app import BATCH_HANDLERS
from client.app import app as client_app
from client.state import save_state
from common.client_state import new_state
from common.methods.gswgan import client as gswgan
from common.methods.gswgan.messages import MSG_QUERY
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests.helpers import ALLOW_NONPRIVATE, tiny_cfg


def run(tmp_path, name, handlers=BATCH_HANDLERS, before=None, **changes):
    cfg = tiny_cfg(
        tmp_path / name,
        **{
            "num_clients": 4,
            "clients_per_step": 3,
            "steps": 4,
            "n_critic": 2,
            "warmup_steps": 2,
            "noise_seed": 5,
            "sampling_seed": 2,
            "wire_dtype": "float32",
            "wire_compression": "none",
            **changes,
        },
    )
    directory = RunDirectory.create(cfg)
    if before is not None:  # what a node's disk holds before the run
        before(cfg, directory)
    transport = InProcessTransport(
        client_app,
        cfg.num_clients,
        node_config=ALLOW_NONPRIVATE,
        batch_handlers=handlers,
        node_state=directory.state_dir,
    )
    summary = run_experiment(cfg, directory, transport, transport_name="inprocess")
    generator = torch.load(directory.path / "checkpoint.pt", weights_only=True)["strategy"]["generator"]
    return summary, generator["ema"]["module"]


def test_stacked_and_one_by_one_runs_agree(tmp_path, monkeypatch):
    calls = []
    stacked_phase = gswgan.stacked_critic_phase
    monkeypatch.setattr(gswgan, "stacked_critic_phase", lambda p, c: calls.append(len(p)) or stacked_phase(p, c))
    stacked, g_stacked = run(tmp_path, "stacked")
    assert calls == [3, 3, 3, 3]  # every step's three clients, as one network
    alone, g_alone = run(tmp_path, "alone", stack_clients=False)
    assert stacked["status"] == alone["status"] == "completed"
    for a, b in zip(stacked["clients"], alone["clients"], strict=True):
        for key in ("client_id", "queries", "epsilon", "bytes_down", "bytes_up"):
            assert a[key] == b[key], key
    assert sum(c["queries"] for c in stacked["clients"]) == 4 * 3
    for key, value in g_stacked.items():
        torch.testing.assert_close(value, g_alone[key], atol=1e-4, rtol=1e-3, msg=key)


def test_a_node_that_breaks_in_a_stacked_step_fails_alone(tmp_path):
    """One node's handler raises inside the batch: that node is failed with its cause; the others
    answer and the run completes."""

    def breaking(messages: list[Message], contexts):
        results = BATCH_HANDLERS[MSG_QUERY](messages, contexts)
        broken = [i for i, c in enumerate(contexts) if c.node_config["partition-id"] == 1]
        for i in broken:
            results[i] = RuntimeError("disk on fire")
        return results

    summary, _ = run(tmp_path, "broken", handlers={MSG_QUERY: breaking}, steps=3)
    assert summary["status"] == "completed"
    clients = {c["client_id"]: c for c in summary["clients"]}
    assert clients[1]["status"] == "failed" and "disk on fire" in clients[1]["failure"]
    assert all(clients[k]["status"] != "failed" for k in (0, 2, 3))


def _small_partition(data):
    data.images, data.labels = data.images[:4], data.labels[:4]


def _labels_out_of_range(data):
    data.labels = torch.full_like(data.labels, 10)


@pytest.mark.parametrize(
    ("breaking", "cause"),
    [
        (_small_partition, "its partition holds 4 images, fewer than batch_size=8"),
        (_labels_out_of_range, "its partition has labels in [10, 10], outside [0, 10)"),
    ],
)
def test_a_client_whose_own_data_breaks_the_stacked_step_fails_alone(tmp_path, breaking, cause):
    """Issue 23, item 12: with m = K, client 1's state file on its node's disk holds a partition that
    cannot serve a query. It once failed every client of the stacked step, so the run stopped after
    0 steps; now it fails alone, with its client id and the cause, and the others train on."""

    def broken_client_1(cfg, directory):
        state = new_state(cfg, 1, critic_lr=cfg.lr_d)
        breaking(state.data)
        save_state(state, directory.state_dir)

    summary, _ = run(tmp_path, "broken-data", before=broken_client_1, clients_per_step=4, steps=2)
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    clients = {c["client_id"]: c for c in summary["clients"]}
    assert clients[1]["status"] == "failed" and clients[1]["queries"] == 1  # charged when sent, as always
    assert f"client 1 cannot answer: {cause}" in clients[1]["failure"]
    assert any(f"client 1 cannot answer: {cause}" in n for n in summary["notes"]), summary["notes"]
    assert [clients[k]["queries"] for k in (0, 2, 3)] == [2, 2, 2]
    assert all(clients[k]["status"] != "failed" for k in (0, 2, 3))
