"""Plots and report.html of a run: valid PNGs for normal and degenerate inputs, a self-contained page."""

from __future__ import annotations

import base64
import copy
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from common.evaluation import frontier_plot, grids, plots
from common.evaluation.report import format_eval_table, write_report
from tests.helpers import TRUST_SERVER_POLICY, tiny_flags

DELTA = 1e-5


def _client(cid: int, queries: int, eps: float | None) -> dict:
    return {
        "client_id": cid,
        "queries": queries,
        "epsilon": eps,
        "epsilon_prv": eps,
        "bytes_down": 605_722 * queries,
        "bytes_up": 102_488 * queries,
    }


@pytest.fixture
def summary(tmp_path: Path) -> dict:
    """The shape of a GS-WGAN summary.json (one client never queried)."""
    return {
        "strategy": "gswgan",
        "status": "completed",
        "dataset": "synthetic",
        "model": "tiny",
        "partition": "writer",
        "steps_completed": 30,
        "steps_planned": 30,
        "num_clients": 5,
        "clients_per_step": 1,
        "batch_size": 32,
        "noise_multiplier": 1.07,
        "clip": 1.0,
        "delta": DELTA,
        "accounting": "per-client, untrusted server: one Gaussian mechanism per query (σ/√B)",
        "clients": [
            _client(0, 8, 181.27),
            _client(1, 5, 124.51),
            _client(2, 9, 199.66),
            _client(3, 0, 0.0),
            _client(4, 8, 181.27),
        ],
        "epsilon_max": 199.66,
        "epsilon_amplified": {
            "epsilon": 246.88,
            "sample_rate": 0.2,
            "steps": 30,
            "query_noise_multiplier": 0.1892,
            "assumption": "amplified, trusted sampling (an assumption about the server)",
        },
        "comm": {
            "bytes_per_step": {"down": 605722.0, "up": 102488.0, "total": 708210.0},
            "bytes_down_total": 18171660,
            "bytes_up_total": 3074640,
        },
        "wall_s": 7.7,
        "run_dir": str(tmp_path / "run"),
        "notes": [],
        "privacy_statement": "Privacy statement (δ = 1e-05). The most exposed client has ε = 200.",
    }


@pytest.fixture
def metrics() -> list[dict]:
    rows = [
        {
            "step": s,
            "time_s": s / 10,
            "train/wasserstein": 0.1 * s,
            "privacy/epsilon_max": 7.0 * s,
            "privacy/epsilon_median": 4.0 * s,
            "privacy/epsilon_amplified": 8.0 * s,
        }
        for s in (10, 20, 30)
    ]
    return rows + [dict(rows[-1])]  # the final row is written twice by the run loop


def assert_png(path: Path, *, min_side: int = 100) -> None:
    assert path.is_file(), path
    with Image.open(path) as img:
        assert img.format == "PNG"
        img.load()
        assert min(img.size) >= min_side, img.size
        low, high = img.convert("L").getextrema()
        assert high > low, "blank image"
    assert not list(path.parent.glob(".*.tmp")), "temporary file left behind"


# --- ε per client ----------------------------------------------------------------------------------
def test_epsilon_per_client_bars(summary: dict, tmp_path: Path) -> None:
    out = plots.plot_epsilon_per_client(summary, tmp_path / "eps.png")
    assert out == tmp_path / "eps.png"
    assert_png(out, min_side=300)


@pytest.mark.parametrize(
    "case", ["null_epsilon", "all_null", "one_client", "many_clients", "no_clients", "no_amplified"]
)
def test_epsilon_per_client_edge_cases(summary: dict, tmp_path: Path, case: str) -> None:
    s = copy.deepcopy(summary)
    if case == "null_epsilon":
        s["clients"][1]["epsilon"] = None
    elif case == "all_null":  # Fed-Avg GAN: unbounded against an untrusted server
        s["clients"] = [_client(i, 3, None) for i in range(4)] + [_client(4, 0, None)]
    elif case == "one_client":
        s["clients"] = [_client(0, 3, 50.0)]
    elif case == "many_clients":
        s["clients"] = [_client(i, i % 4, 20.0 * (i % 4) or None) for i in range(200)]
    elif case == "no_clients":
        s["clients"] = []
    else:
        del s["epsilon_amplified"], s["delta"]
    assert_png(plots.plot_epsilon_per_client(s, tmp_path / f"{case}.png"))


def test_client_epsilons_zero_for_idle_and_none_for_unbounded() -> None:
    rows = plots.client_epsilons(
        {
            "clients": [
                _client(0, 0, None),
                _client(1, 2, None),
                _client(2, 1, 3.5),
                {"queries": 1, "epsilon": float("inf")},
            ]
        }
    )
    assert rows == [(0, 0.0, 0), (1, None, 2), (2, 3.5, 1), (3, None, 1)]


# --- ε vs FID --------------------------------------------------------------------------------------
def test_epsilon_vs_fid(tmp_path: Path) -> None:
    points = [
        {"step": 100, "epsilon_max": 20.0, "fid": 180.0},
        {"step": 200, "epsilon_max": 35.0, "fid": None},
        {"step": 300, "epsilon_max": None, "fid": 90.0},
        {"step": 400, "epsilon_max": 60.0, "fid": 75.0},
    ]
    assert_png(plots.plot_epsilon_vs_fid(points, tmp_path / "fid.png", delta=DELTA), min_side=300)


@pytest.mark.parametrize(
    "points",
    [
        [{"step": 100, "epsilon_max": 20.0, "fid": 180.0}],
        [],
        [{"step": 100, "epsilon_max": None, "fid": None}, {"step": 200}],
    ],
)
def test_epsilon_vs_fid_degenerate(tmp_path: Path, points: list[dict]) -> None:
    assert_png(plots.plot_epsilon_vs_fid(points, tmp_path / "fid.png"))


def test_epsilon_vs_inception_score_with_std(tmp_path: Path) -> None:
    points = [{"step": s, "epsilon_max": 10.0 * s, "inception_score": [1.0 + s, 0.1]} for s in (1, 2, 3)]
    assert_png(plots.plot_epsilon_vs_fid(points, tmp_path / "is.png", metric="inception_score"))


# --- training curves, bytes --------------------------------------------------------------------------
def test_training_curves(metrics: list[dict], tmp_path: Path) -> None:
    assert_png(plots.plot_training_curves(metrics, tmp_path / "curves.png", delta=DELTA), min_side=300)


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [{"step": 10, "train/wasserstein": 0.3}, {"step": 20, "privacy/epsilon_max": 5.0}, {"time_s": 1.0}],
        [{"step": 10, "privacy/epsilon_max": None, "train/wasserstein": None}],
    ],
)
def test_training_curves_missing_keys(tmp_path: Path, rows: list[dict]) -> None:
    assert_png(plots.plot_training_curves(rows, tmp_path / "curves.png"))


def test_bytes_per_step(summary: dict, tmp_path: Path) -> None:
    fedavg = {"strategy": "fedavg-gan", "comm": {"bytes_per_step": {"down": 3.9e7, "up": 1.95e7}}}
    labelled = {"label": "gswgan float16", "bytes_per_step": {"down": 3.0e5, "up": 5.1e4}}
    no_comm = {"strategy": "dpgan"}
    assert_png(plots.plot_bytes_per_step([summary, fedavg, labelled, no_comm], tmp_path / "b.png"), min_side=300)
    assert_png(plots.plot_bytes_per_step([no_comm], tmp_path / "none.png"))


def test_format_bytes() -> None:
    assert plots.format_bytes(605722) == "606 kB"
    assert plots.format_bytes(3.94e7) == "39.4 MB"
    assert plots.format_bytes(12) == "12 B"
    assert plots.format_bytes(None) == "n/a"


# --- sample grids ----------------------------------------------------------------------------------
def test_sample_grid_from_images(tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(10 * 4, 28, 28), dtype=np.uint8)
    assert_png(grids.plot_sample_grid(images, tmp_path / "grid.png", rows=10, title="step 30"), min_side=300)
    floats = images[:, None].astype(np.float32) / 255.0  # [N, 1, H, W] in [0, 1], as G outputs
    assert_png(grids.plot_sample_grid(floats, tmp_path / "grid_f.png", rows=10))


def test_sample_grid_from_tiled_grid(tmp_path: Path) -> None:
    grid = grids.tile_images(np.full((6, 28, 28), 200, dtype=np.uint8), rows=3)
    assert grid.shape == (3 * 30 + 2, 2 * 30 + 2)
    assert_png(grids.plot_sample_grid(grid, tmp_path / "grid.png", rows=3))


def test_sample_grid_rejects_uneven_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows"):
        grids.plot_sample_grid(np.zeros((7, 28, 28), dtype=np.uint8), tmp_path / "g.png", rows=3)


def test_side_by_side(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    left, right = tmp_path / "left.png", tmp_path / "right.png"
    Image.fromarray(grids.tile_images(rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), rows=10)).save(left)
    Image.fromarray(255 - np.asarray(Image.open(left))).save(right)
    out = grids.side_by_side(left, right, tmp_path / "sbs.png", titles=("suspect clients", "the rest"), rows=10)
    assert_png(out, min_side=300)
    with Image.open(out) as img:
        assert img.width > img.height  # two grids next to each other


# --- report ----------------------------------------------------------------------------------------
EVAL = {
    "fid": {"value": 212.3, "num_samples": 2000},
    "fid_domain": 41.7,
    "fid_domain_num_samples": 1000,
    "inception_score": [3.1, 0.05],
    "gen2real_acc": {"cnn": 0.412, "mlp": 0.3, "num_samples": 500},
    "real2gen_acc": {"cnn": None, "mlp": 0.25, "num_train": 6000, "num_test": 2000},
    "num_samples": 2000,
}


def _run_dir(tmp_path: Path, summary: dict, **changes) -> Path:
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps({**summary, **changes}))
    return run


def _embedded_images(page: str) -> list[Image.Image]:
    return [
        Image.open(io.BytesIO(base64.b64decode(b64)))
        for b64 in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    ]


def test_write_report(summary: dict, metrics: list[dict], tmp_path: Path) -> None:
    run = _run_dir(tmp_path, summary, notes=["check <script>alert('x')</script> & more"])
    figs = {
        "epsilon_per_client": plots.plot_epsilon_per_client(summary, run / "plots" / "eps.png"),
        "training_curves": plots.plot_training_curves(metrics, run / "plots" / "curves.png"),
    }
    out = write_report(run, EVAL, figs)
    assert out == run / "report.html"
    page = out.read_text()
    for text in (
        "gswgan",
        "δ = 1e-05",
        "min 124.5",
        "median 181.3",
        "max 199.7",
        "246.9",
        "trusted sampling",
        "605,722",
        "102,488",
        "7.7 s",
        "per-client, untrusted server",
        "212.3",
        "41.7",
        "3.1 ± 0.05",
        "CNN 41.2%",
        "MLP 30.0%",
        "CNN n/a",
        "2,000",
        "1,000",
        "500",
        "The most exposed client has ε = 200",
    ):
        assert text in page, text
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    images = _embedded_images(page)
    assert len(images) == 2 and all(img.format == "PNG" for img in images)
    assert "http://" not in page and "https://" not in page and "<link" not in page  # self-contained


@pytest.mark.parametrize(
    "eval_result",
    [None, {}, {"fid": None, "inception_score": None, "gen2real_acc": None, "real2gen_acc": {"cnn": None}}],
)
def test_write_report_survives_missing_evaluation(summary: dict, tmp_path: Path, eval_result) -> None:
    run = _run_dir(tmp_path, summary)
    page = write_report(run, eval_result, {}, title="<b>title</b>").read_text()
    assert "&lt;b&gt;title&lt;/b&gt;" in page
    if eval_result and "fid" in eval_result:
        assert "n/a" in page
    else:
        assert "No evaluation results" in page


def test_write_report_unbounded_epsilon_and_missing_plot(summary: dict, tmp_path: Path) -> None:
    fedavg = {
        **summary,
        "strategy": "fedavg-gan",
        "epsilon_max": None,
        "clients": [_client(i, 2, None) for i in range(3)],
        "comm": {},
        "wall_s": None,
    }
    fedavg.pop("epsilon_amplified")
    run = _run_dir(tmp_path, fedavg)
    page = write_report(run, {"fid": 10.0}, {"bytes_per_step": run / "absent.png"}).read_text()
    assert "unbounded (null) for 3 client(s)" in page
    assert "absent.png" in page and "could not be read" in page


def test_write_report_adds_latest_sample_grid(summary: dict, tmp_path: Path) -> None:
    run = _run_dir(tmp_path, summary)
    for step, value in ((10, 0), (30, 255)):
        Image.fromarray(np.full((62, 62), value, dtype=np.uint8)).save(run / "samples" / f"step-{step:06d}.png")
    page = write_report(run, {}, {}).read_text()
    images = _embedded_images(page)
    assert len(images) == 1 and images[0].getextrema() == (255, 255)  # the latest grid
    assert "at step 30" in page


def test_write_report_needs_summary(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="summary.json"):
        write_report(tmp_path, {}, {})


def test_format_eval_table() -> None:
    table = format_eval_table(EVAL)
    lines = table.splitlines()
    assert lines[0].split() == ["evaluation", "value", "samples"]
    assert any("FID (Inception" in line and "212.3" in line and "2,000" in line for line in lines)
    assert any("gen2real" in line and "CNN 41.2% · MLP 30.0%" in line and line.endswith("500") for line in lines)
    assert any(
        "real2gen" in line and "CNN n/a · MLP 25.0%" in line and line.endswith("train 6,000 · test 2,000")
        for line in lines
    )
    assert format_eval_table({}) == "no evaluation results"
    assert "n/a" in format_eval_table({"fid": None})


def test_the_evaluation_table_shows_figures_not_bookkeeping() -> None:
    """Issue 14, item 18: eval.json's privacy block, curve and step count were dumped as rows."""
    result = {**EVAL, "privacy": {"epsilon": 3.0}, "curve": [{"step": 1}], "steps_completed": 300, "extra": 0.5}
    table = format_eval_table(result)
    assert "privacy" not in table and "curve" not in table and "steps_completed" not in table
    assert "extra" in table and "0.5" in table


# --- on a real run directory -------------------------------------------------------------------------
@pytest.mark.slow
def test_plots_and_report_from_a_tiny_simulation(tmp_path_factory: pytest.TempPathFactory) -> None:
    from simulations.cli import main

    run = tmp_path_factory.mktemp("sim") / "run"
    main(["simulate", *tiny_flags(steps=3, synthetic_samples_per_writer=24, log_every=1, out=run)])
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    figs = {
        "epsilon_per_client": plots.plot_epsilon_per_client(summary, run / "plots" / "eps.png"),
        "training_curves": plots.plot_training_curves(rows, run / "plots" / "curves.png", delta=summary["delta"]),
        "bytes_per_step": plots.plot_bytes_per_step([summary], run / "plots" / "bytes.png"),
    }
    for path in figs.values():
        assert_png(path, min_side=300)
    page = write_report(run, {}, figs).read_text()
    assert len(_embedded_images(page)) == 4  # three plots and the run's latest sample grid
    assert f"δ = {summary['delta']:g}" in page


@pytest.mark.parametrize(
    "strategy, says, never",
    [
        (
            "dpgan",
            ["ε per example, trusted curator", "B = 16", "q = 0.1333"],
            ["per client, untrusted server", "m per step"],
        ),
        (
            "fedavg-gan",
            [
                "ε per client, untrusted server",
                "S = 0.1",
                "z = 0.01",
                "user-level, trusted server",
                "raw discriminator delta",
            ],
            ["σ = 1.07", "C = 1"],
        ),
    ],
)
def test_report_labels_each_strategys_guarantee_and_mechanism(
    tmp_path: Path, strategy: str, says: list[str], never: list[str]
) -> None:
    """DPGAN's ε is example-level with a trusted curator, and Fed-Avg's mechanism is S and z: the page
    must not call the one per-client/untrusted, nor show GS-WGAN's σ and C for the other."""
    from simulations.cli import main

    run = tmp_path / "run"
    args = ["simulate", *tiny_flags(strategy=strategy, steps=2, dpgan_n_d=1, n_critic=None, out=run)]
    assert main([*args, "--node-policy", str(TRUST_SERVER_POLICY)]) == 0
    page = write_report(run, {}, {}).read_text()
    for text in says:
        assert text in page, text
    for text in never:
        assert text not in page, text


# --- the frontier ------------------------------------------------------------------------------------
FRONTIER_ROWS = [
    {"strategy": "gswgan", "target": 10.0, "epsilon": 9.99, "epsilon_unit": "per-client", "fid_domain": 300.0},
    {"strategy": "gswgan", "target": 1.0, "epsilon": 0.98, "epsilon_unit": "per-client", "fid_domain": 900.0},
    {"strategy": "gswgan", "target": math.inf, "epsilon": None, "epsilon_unit": "per-client", "fid_domain": 80.0},
    {"strategy": "dpgan", "target": math.inf, "epsilon": 3e9, "epsilon_unit": "example-level", "fid_domain": 60.0},
    {"strategy": "dpgan", "target": 10.0, "epsilon": 9.9, "epsilon_unit": "example-level", "fid_domain": None},
]


def test_frontier_series_puts_the_noiseless_runs_right_of_every_finite_epsilon() -> None:
    series, inf_x = frontier_plot.frontier_series(FRONTIER_ROWS, "fid_domain")
    assert inf_x == pytest.approx(99.9)  # 10x the largest finite ε; DPGAN's 3e9 at σ = 1e-6 is an ∞ point
    assert series["gswgan"] == [(0.98, 900.0), (9.99, 300.0), (pytest.approx(99.9), 80.0)]
    assert series["dpgan"] == [(pytest.approx(99.9), 60.0)]  # the row without a value is left out


@pytest.mark.parametrize("rows", [FRONTIER_ROWS, [], [{"strategy": "x", "target": 1.0, "epsilon": None}]])
def test_frontier_plot(tmp_path: Path, rows: list[dict]) -> None:
    assert_png(frontier_plot.plot_frontier(rows, tmp_path / "frontier.png"))


def test_thin_plots_say_how_to_get_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14, item 18: one ε-vs-FID dot and an empty critic panel now say what would fill them."""
    texts: list[str] = []
    save = plots._save

    def capture(fig, path):
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", capture)
    plots.plot_epsilon_vs_fid([{"step": 100, "epsilon_max": 20.0, "fid": 180.0}], tmp_path / "a.png")
    assert plots.ONE_POINT_HINT in texts
    plots.plot_training_curves([{"step": 1, "privacy/epsilon_max": 1.0}], tmp_path / "b.png", delta=DELTA)
    assert plots.NO_CRITIC_HINT in texts
    summary = {
        "delta": DELTA,
        "clients": [{"client_id": 0, "epsilon": 5.0, "queries": 3}],
        "epsilon_amplified": {"epsilon": 9.0},
    }
    plots.plot_epsilon_per_client(summary, tmp_path / "c.png")
    assert plots.AMPLIFIED_ABOVE_HINT in texts
