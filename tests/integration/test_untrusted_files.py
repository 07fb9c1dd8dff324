"""No file the project reads runs code (issue 23, item 10): a checkpoint, a snapshot or a node's
state file whose pickle calls a function is refused, with a clear message and exit code 2, and the
function never runs. Also evaluate's checks of a malformed summary.json (item 19)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from simulations.cli import main
from tests.helpers import tiny_flags


class RunsCode:
    """Unpickling this calls ``os.system``: what a hostile run directory would ship."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One tiny finished run with snapshots, copied by each test that alters it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["simulate", *tiny_flags(steps=3, checkpoint_every=2, eval_every=2, out=out), "--no-eval"]) == 0
    return out


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))


def _hostile(path, marker, **keep) -> None:
    torch.save({**keep, "payload": RunsCode(marker)}, path)


def test_resume_and_evaluate_refuse_a_checkpoint_that_would_run_code(finished_run, tmp_path, capsys):
    run, marker = _copy(finished_run, tmp_path), tmp_path / "code-ran"
    real = torch.load(run / "checkpoint.pt", weights_only=True)
    _hostile(run / "checkpoint.pt", marker, **real)  # everything a resume needs, plus the payload
    assert main(["simulate", "--resume", str(run), "--steps", "5", "--no-eval"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'checkpoint.pt'} holds a reference to posix.system" in err and "refused" in err, err
    assert main(["evaluate", str(run), "--no-inception", "--num-samples", "50"]) == 2
    err = capsys.readouterr().err
    assert "posix.system" in err and "Traceback" not in err, err
    assert not marker.exists()


def test_evaluate_refuses_a_snapshot_that_would_run_code(finished_run, tmp_path, capsys):
    run, marker = _copy(finished_run, tmp_path), tmp_path / "code-ran"
    snapshot = sorted((run / "snapshots").glob("step-*.pt"))[0]
    _hostile(snapshot, marker, **torch.load(snapshot, weights_only=True))
    assert main(["evaluate", str(run), "--no-inception", "--num-samples", "50"]) == 2
    assert f"{snapshot} holds a reference to posix.system" in capsys.readouterr().err
    assert not marker.exists()


def test_a_client_state_file_that_would_run_code_is_refused(tmp_path):
    from client.state import load_state, save_state
    from common.client_state import new_state
    from tests.helpers import tiny_cfg

    cfg, marker = tiny_cfg(tmp_path / "run"), tmp_path / "code-ran"
    save_state(new_state(cfg, 0, critic_lr=cfg.lr_d), tmp_path)
    path = tmp_path / "client-00000.pt"
    _hostile(path, marker, **torch.load(path, weights_only=True))
    with pytest.raises(RuntimeError, match="posix.system"):
        load_state(cfg, 0, tmp_path, version=1, critic_lr=cfg.lr_d)
    assert not marker.exists()


def test_a_dpgan_node_file_that_would_run_code_is_refused(tmp_path):
    from common.io.tensor_files import UnsafeFileError
    from common.methods.dpgan import storage as dpgan

    marker = tmp_path / "code-ran"
    _hostile(dpgan.node_path(tmp_path), marker, ledger={"format": "x", "history": []})
    with pytest.raises(UnsafeFileError, match="posix.system"):
        dpgan.load_ledger(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "clients, named",
    [
        ("every client", "clients field"),
        ([1, 2], "clients field"),
        ([{"client_id": 0, "queries": "5", "epsilon": 1.0}], "clients[0].queries is '5'"),
        ([{"client_id": 0, "queries": 2, "epsilon": "NaN"}], "clients[0].epsilon is 'NaN'"),
        (None, "clients is None"),
    ],
)
def test_evaluate_names_a_malformed_clients_field(finished_run, tmp_path, capsys, clients, named):
    run = _copy(finished_run, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "clients": clients}))
    assert main(["evaluate", str(run), "--no-inception", "--num-samples", "50"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'summary.json'} is malformed" in err and named in err and "Traceback" not in err, err
