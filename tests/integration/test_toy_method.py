"""Adding a method is its folder and one registry line: a toy method from a test folder, registered
as that line would register it, runs end to end (tiny, in-process) through the unchanged shells:
the hello, its step messages through the one generic handler, the ledgers, the node ledger, the
reports and their schema."""

import json

import pytest
from google.protobuf import json_format

from client.app import batch_handlers, make_client_app
from common.methods import METHODS, ExperimentConfig
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.node_ledger import read_node_book
from protos import fedgan_pb2 as pb
from server.loop import run_experiment
from server.reporting import RunDirectory
from server.transport import InProcessTransport
from tests import toy_method
from tests.helpers import tiny_cfg
from tests.unit.common.methods.test_protocol import check_method


@pytest.fixture
def toy(monkeypatch):
    """The registry with the toy's line in it (``common/methods/__init__.py``'s ``FOLDERS``)."""
    monkeypatch.setitem(METHODS, toy_method.METHOD.name, toy_method.METHOD)
    return toy_method.METHOD


def run_toy(tmp_path, **changes):
    cfg = tiny_cfg(tmp_path / "run", strategy="toy", steps=3, **changes)
    run = RunDirectory.create(cfg)
    # The ClientApp as a process started with the toy registered builds it.
    transport = InProcessTransport(
        make_client_app(), cfg.num_clients, batch_handlers=batch_handlers(), node_state=run.state_dir
    )
    return cfg, run, run_experiment(cfg, run, transport, transport_name="inprocess")


def test_a_method_from_a_test_folder_runs_end_to_end(tmp_path, toy):
    check_method(toy)  # the written contract, as for every registered method
    cfg, run, summary = run_toy(tmp_path)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert [c["queries"] for c in summary["clients"]] == [3, 3, 3]
    expected = PrivacyLedger([PrivacyEvent(noise_multiplier=toy_method.NOISE, count=3)]).epsilon(delta=cfg.delta)
    assert all(c["epsilon"] == pytest.approx(expected) for c in summary["clients"])
    assert summary["method"] == {"toy": {"noise_multiplier": toy_method.NOISE}}
    for name, schema in (("summary.json", pb.RunSummary()), ("privacy.json", pb.PrivacyReport())):
        json_format.ParseDict(json.loads((run.path / name).read_text()), schema)  # the schema needs no change
    assert [read_node_book(run.state_dir, k).by_method for k in range(3)] == [{"toy": 3}] * 3


def test_the_toy_is_refused_the_one_way_and_its_options_validated_by_the_registry(tmp_path, toy):
    """Its nodes' budget refuses a release beyond it (an answer saying why, no failure); the
    registry's checks reach it like any other method's (DPAC needs a method with a DPAC form)."""
    cfg, _, summary = run_toy(tmp_path, client_epsilon_budget=3.5)  # room for two releases of the three
    assert summary["status"].startswith("stopped") and summary["failed_clients"] == []
    assert [c["queries"] for c in summary["clients"]] == [2, 2, 2]
    assert any("refuses: one more mean would exceed the run's epsilon budget" in n for n in summary["notes"])
    with pytest.raises(ValueError, match="strategy toy has no DPAC form"):
        ExperimentConfig(strategy="toy", dpac_beta=0.5)
