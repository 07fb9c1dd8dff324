"""Issue 26, item 1: `fedgan evaluate --protocol` on a real (tiny) run, and the protocol's holdout."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from common.config import ConfigError
from common.data import clear_cache, client_arrays, partition_sizes
from common.data.clients import training_set
from common.data.protocol import protocol_validation
from common.evaluation import anchors
from common.methods import ExperimentConfig
from simulations.cli import main
from simulations.experiments.evaluate import evaluate_run
from tests.helpers import tiny_flags


def test_protocol_holdout_removes_the_validation_images_from_every_partition():
    clear_cache()
    try:
        cfg = ExperimentConfig(num_clients=4, partition="iid", synthetic_writers=6, protocol_holdout=True)
        dataset = training_set(cfg)
        val = protocol_validation(len(dataset))
        assert sum(partition_sizes(cfg)) == len(dataset) - len(val)
        held = {img.tobytes() for img in dataset.images[val]}
        assert not any(img.tobytes() in held for k in range(4) for img in client_arrays(cfg, k)[0])
        both = dataclasses.replace(cfg, public_data="holdout", public_size=30)  # with a public holdout too
        assert sum(partition_sizes(both)) < len(dataset) - len(val)
    finally:
        clear_cache()
    with pytest.raises(ConfigError, match="protocol_holdout"):
        ExperimentConfig(num_clients=4, partition="writer", protocol_holdout=True).validate()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("protocol") / "run"
    assert main(["simulate", *tiny_flags(steps=4, out=out)]) == 0
    return out


def test_evaluate_with_the_protocol_writes_its_figures_and_keeps_them_private(run_dir, monkeypatch, capsys):
    tiny = dataclasses.replace(
        anchors.RECIPES["dpimagebench-cpu"], name="tiny", synthetic_size=240, epochs=2, step_epochs=1, batch_size=64
    )
    monkeypatch.setitem(anchors.RECIPES, "tiny", tiny)
    result = evaluate_run(run_dir, num_samples=40, inception=False, progress=False, protocol="tiny")
    got = result["protocol"]
    assert got["protocol"] == "tiny" and set(got["classifiers"]) == {"resnet", "wrn", "resnext"}
    accs = [c["test_acc"] for c in got["classifiers"].values()]
    assert got["mean"] == pytest.approx(np.mean(accs)) and all(0 <= a <= 1 for a in accs)
    assert got["num_train"] == 220 and got["num_test"] > 0 and got["num_validation"] > 0
    assert got["validation_in_training"] is True and got["publishable"] is False
    assert got["fid"]["value"] is None  # --no-inception
    assert got["device"] == "cpu"  # where the classifiers trained, for tables that mix devices
    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["protocol"]["mean"] == got["mean"]
    published = json.loads((run_dir / "publish" / "release.json").read_text())["eval"]
    assert "protocol" not in published
    from simulations.experiments.evaluate import print_eval

    print_eval(result)
    assert "tiny: gen2real" in capsys.readouterr().out


def test_an_unknown_protocol_is_refused_by_the_cli(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", str(run_dir), "--protocol", "dpimagebench-gpu"])
    assert exit_.value.code == 2 and "dpimagebench-cpu" in capsys.readouterr().err


def test_a_packed_run_still_evaluates_under_the_protocol(run_dir, tmp_path, monkeypatch):
    """scripts/gpu_protocol_runs.py carries only what `fedgan evaluate` reads (its KEEP list and the
    released generator): a real run's slim copy must evaluate, or the GPU call learns it too late."""
    import importlib.util

    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("gpu_protocol_runs", ROOT / "scripts" / "gpu_protocol_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tiny = dataclasses.replace(
        anchors.RECIPES["dpimagebench-cpu"], name="tiny", synthetic_size=240, epochs=1, step_epochs=1, batch_size=64
    )
    monkeypatch.setitem(anchors.RECIPES, "tiny", tiny)
    (copy,) = module.pack([run_dir], carry=tmp_path / "carry")
    result = evaluate_run(copy, num_samples=40, inception=False, progress=False, protocol="tiny")
    assert result["protocol"]["protocol"] == "tiny" and result["protocol"]["device"] == "cpu"
