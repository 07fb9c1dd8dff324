"""`fedgan evaluate` on a real (tiny) run, and its clear errors on bad run directories."""

import json

import pytest

from server.reporting import RunDirectoryError
from simulations.cli import main
from simulations.experiments.evaluate import evaluate_run
from tests.helpers import tiny_flags


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    assert main(["simulate", *tiny_flags(steps=6, eval_every=3, out=out)]) == 0
    return out


def test_evaluate_writes_eval_json_plots_and_report(run_dir, capsys):
    code = main(["evaluate", str(run_dir), "--num-samples", "60", "--no-inception", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "domain FID" in printed and "report.html" in printed
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["fid_domain"]["num_samples"] == 60 and result["fid_domain"]["value"] > 0
    assert result["fid"]["value"] is None  # --no-inception
    assert 1.0 <= result["inception_score"]["mean"] <= 10.0
    for key in ("gen2real_acc", "real2gen_acc"):
        assert set(result[key]) >= {"cnn", "mlp", "num_train", "num_test"}
    assert [p["step"] for p in result["curve"]] == [3, 6]  # the snapshots of --eval-every 3
    assert result["privacy"]["epsilon_max"] == json.loads((run_dir / "summary.json").read_text())["epsilon_max"]
    # Audit: figures computed from the clients' own training data sat unmarked in publishable reports.
    private = {
        k
        for k in ("fid", "fid_domain", "inception_score", "gen2real_acc", "real2gen_acc")
        if not result[k]["publishable"]
    }
    assert private == {"fid_domain", "inception_score", "real2gen_acc"}
    assert all("training split" in result[k]["data"] for k in private)
    published = json.loads((run_dir / "publish" / "release.json").read_text())["eval"]
    assert set(published) == {"fid", "gen2real_acc"} and published["gen2real_acc"] == result["gen2real_acc"]
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64" in html and "domain FID" in html
    for name in ("epsilon_per_client", "training_curves", "epsilon_vs_fid_domain"):
        assert (run_dir / "plots" / f"{name}.png").stat().st_size > 1000


def test_empty_or_corrupt_run_directories_are_clear_errors(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{not json")
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_a_generator_that_does_not_match_the_config_is_named(run_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["model"] = "small"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunDirectoryError, match="does not match config.json"):
        evaluate_run(copy, num_samples=20, inception=False, progress=False)
