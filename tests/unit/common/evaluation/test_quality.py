"""The terminal's evaluation table shows figures only, and a generator that learned little says so
(issue 43, item 2)."""

from __future__ import annotations

import pytest

from common.evaluation.quality import FID_BOUND, quality_warnings
from common.evaluation.report import format_eval_table

# eval.json's shape: each accuracy carries its provenance beside the classifiers' figures
GEN2REAL = {"cnn": 0.716, "mlp": 0.652, "data": "classifiers trained on generated images", "publishable": True}


def test_the_accuracy_rows_show_the_classifiers_and_not_the_provenance() -> None:
    table = format_eval_table({"gen2real_acc": {**GEN2REAL, "num_train": 2000, "num_test": 2000}})
    row = next(line for line in table.splitlines() if line.startswith("gen2real"))
    assert "CNN 71.6% · MLP 65.2%" in row
    assert "DATA" not in table and "PUBLISHABLE" not in table and "n/a" not in table


@pytest.mark.parametrize(
    ("cnn", "mlp", "classes", "warned"),
    [(0.11, 0.10, 10, True), (0.149, 0.12, 10, True), (0.16, 0.12, 10, False), (0.716, 0.652, 10, False)],
)
def test_a_generator_near_chance_is_named(cnn: float, mlp: float, classes: int, warned: bool) -> None:
    lines = quality_warnings({"gen2real_acc": {**GEN2REAL, "cnn": cnn, "mlp": mlp}}, num_classes=classes)
    assert bool(lines) == warned
    if warned:
        assert "chance (10% for 10 classes)" in lines[0]


def test_chance_depends_on_the_classes() -> None:
    """47 EMNIST classes: 10% is far above chance (2%)."""
    assert not quality_warnings({"gen2real_acc": {"cnn": 0.10, "mlp": 0.09}}, num_classes=47)


def test_an_fid_above_the_bound_is_named_and_absent_figures_are_not() -> None:
    lines = quality_warnings({"fid": {"value": 503.3, "num_samples": 500}}, num_classes=10)
    assert len(lines) == 1 and f"above {FID_BOUND:.0f}" in lines[0]
    assert not quality_warnings({"fid": {"value": 214.0}}, num_classes=10)
    assert not quality_warnings({"fid": {"value": None}, "gen2real_acc": {"cnn": None}}, num_classes=10)
    assert not quality_warnings({}, num_classes=None)


def test_the_report_shows_the_warnings_under_its_evaluation(tmp_path) -> None:
    from common.evaluation.report import render_report

    summary = {"strategy": "gswgan", "clients": [], "run_dir": str(tmp_path)}
    near_chance = {"gen2real_acc": {"cnn": 0.11, "mlp": 0.10}, "num_classes": 10}
    page = render_report(summary, near_chance, {}, title="run")
    assert "within 5 points of chance" in page and page.index("Evaluation") < page.index("within 5 points")
    assert "chance" not in render_report(summary, {**near_chance, "gen2real_acc": {"cnn": 0.7}}, {}, title="run")
