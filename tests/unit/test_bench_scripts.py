"""Every benchmark under bench/ still loads: a module it imports that was moved or renamed fails here,
not on the day someone needs the figure (bench/ runs no tests of its own and CI never times it)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT

SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 5


def load_bench(path, monkeypatch):
    """The benchmark at ``path`` as a module: its imports run, not its benchmark (guarded by __main__)."""
    monkeypatch.syspath_prepend(str(path.parent))  # as `python bench/x.py` would: siblings import
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_loads_and_has_an_entry_point(path, monkeypatch):
    module = load_bench(path, monkeypatch)
    if "__main__" in path.read_text():
        assert callable(getattr(module, "main", None)), f"{path.name}: no main()"


def test_gpu_step_runs_the_gswgan_step_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The GPU benchmark is written for a lent GPU but runs anywhere: a tiny CPU run gives a figure."""
    module = load_bench(ROOT / "bench" / "gpu_step.py", monkeypatch)
    out = tmp_path / "gpu_step.json"
    argv = ["--device", "cpu", "--model", "tiny", "--clients", "2", "--steps", "3", "--warmup", "1"]
    assert module.main([*argv, "--warm-iters", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["steps_timed"] == 3
    assert set(result["arms"]) == {"eager", "graphs"}  # on the CPU both arms run eagerly
    assert all(
        arm["ms_per_step_median"] > 0 and arm["ms_per_warm_start_iteration"] > 0 for arm in result["arms"].values()
    )
    assert "ms/step, graphs" in capsys.readouterr().out


def test_profile_step_writes_its_tables(tmp_path, monkeypatch, capsys):
    module = load_bench(ROOT / "bench" / "profile_step.py", monkeypatch)
    out = tmp_path / "profile.txt"
    assert module.main(["--device", "cpu", "--model", "tiny", "--steps", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("eager: ") and "aten::" in text
    assert "profile_step: eager" in capsys.readouterr().out


def test_frontier_runs_a_point_and_recomputes_its_epsilon(tmp_path, monkeypatch, capsys):
    """One tiny GS-WGAN point and one lever row through the real CLI: table, plot and JSON are written,
    and each point's ε is the one its privacy.json recomputes to (the script stops otherwise)."""
    module = load_bench(ROOT / "bench" / "frontier.py", monkeypatch)
    monkeypatch.setitem(module.LEVERS, "cpu", module.LEVERS["cpu"][:2])  # two levers: one extra run
    argv = [
        "--only",
        "gswgan",
        "--targets",
        "10",
        "--levers-at",
        "10",
        "--no-inception",
        "--jobs",
        "1",
        "--variants",
        "0",
    ]
    argv += ["--dataset", "synthetic", "--work", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    argv += ["--", "--model", "tiny", "--steps", "3", "--num-clients", "4", "--eval-samples", "100"]
    assert module.main(argv) == 0
    result = json.loads((tmp_path / "out" / "frontier-synthetic-cpu.json").read_text())
    (dpac,) = [row for row in result["points"] if "variant" in row]
    main, *levers = [row for row in result["points"] if "variant" not in row]
    assert main["strategy"] == "gswgan" and main["epsilon"] == pytest.approx(10, rel=1e-3)
    assert dpac["variant"] == module.VARIANTS[0][1] and dpac["epsilon"] == pytest.approx(10, rel=1e-3)
    assert json.loads((Path(dpac["run_dir"]) / "config.json").read_text())["dpac_beta"] == 0.5
    assert main["epsilon_recomputed"] == main["epsilon"]
    # the run's own training wall, as a later --collect-only of the same run reads it
    assert main["wall_s"] == json.loads((Path(main["run_dir"]) / "summary.json").read_text())["wall_s"]
    assert [row["lever"] for row in levers] == ["as published", module.LEVERS["cpu"][1][0]]
    assert levers[-1]["run_dir"] == main["run_dir"]  # the last lever row is the main row, run once
    table = (tmp_path / "out" / "frontier-synthetic-cpu.md").read_text()
    assert "per-client, untrusted server" in table and "as published" in table
    assert "| gswgan | baseline |" in table and f"| gswgan | {module.VARIANTS[0][1]} |" in table
    assert (tmp_path / "out" / "frontier-synthetic-cpu.png").stat().st_size > 1000


@pytest.mark.parametrize("strategy", ["gswgan", "dpgan", "fedavg-gan", "dp-merf", "dp-ntk"])
def test_frontier_flags_parse_for_every_point(strategy, tmp_path, monkeypatch):
    """Every point's flags are ones `fedgan simulate` accepts (the ∞ point swaps the target for no noise)
    and that the nodes' policy admits (∞: allow-nonprivate; Fed-Avg without secure sums: trust-server)."""
    import argparse

    from common.privacy.policy import policy_from_file
    from simulations.cli import build_parser

    module = load_bench(ROOT / "bench" / "frontier.py", monkeypatch)
    args = argparse.Namespace(dataset="fashion-mnist", device="cpu", fid_samples=200, inception=True, extra=[])
    args.work = tmp_path / "work"
    for extra in ([], ["--secure-aggregation"]):
        args.extra = extra
        for target in (1.0, float("inf")):
            flags = module.run_flags("cpu", strategy, target, args, tmp_path / "run")
            parsed = build_parser().parse_args(flags)
            assert parsed.strategy == strategy
            policy = policy_from_file(flags[flags.index("--node-policy") + 1]) if "--node-policy" in flags else None
            assert (
                (target == float("inf"))
                == ("--target-epsilon" not in flags)
                == bool(policy and policy.allow_nonprivate)
            )
            trusted = strategy == "fedavg-gan" and not extra
            assert trusted == bool(policy and policy.trust_server), (strategy, extra, target)
    for i, (variant_strategy, _, _) in enumerate(module.VARIANTS):
        if variant_strategy == strategy:
            flags = module.run_flags("cpu", strategy, 100.0, args, tmp_path / "run", variant=i)
            assert build_parser().parse_args(flags).strategy == strategy


def test_frontier_reads_a_runs_protocol_figures_and_tabulates_them(tmp_path, monkeypatch):
    """--protocol: a point takes its run's figures under that protocol (and none of another one)."""
    module = load_bench(ROOT / "bench" / "frontier_protocol.py", monkeypatch)
    fid = {"value": 88.0, "num_samples": 2000}
    got = {"protocol": "dpimagebench-cpu", "mean": 0.71, "std": 0.02, "mean_noiseless_selection": 0.72, "fid": fid}
    (tmp_path / "eval.json").write_text(json.dumps({"protocol": {**got, "validation_in_training": False}}))
    point = module.protocol_figures(tmp_path, "dpimagebench-cpu", evaluate=False)
    assert point["protocol_acc"] == 0.71 and point["protocol_fid"] == 88.0
    assert module.protocol_cell(point) == "71.0% ± 2.0%, FID 88 (N 2,000)"
    assert module.protocol_figures(tmp_path, "dpimagebench", evaluate=False)["protocol_acc"] is None
    assert module.protocol_cell({"protocol_acc": None}) == "—"
    gpu = {**got, "fid": {"value": None, "num_samples": 3000}, "validation_in_training": False, "device": "NVIDIA H200"}
    (tmp_path / "eval.json").write_text(json.dumps({"protocol": gpu}))
    point = module.protocol_figures(tmp_path, "dpimagebench-cpu", evaluate=False)
    assert module.protocol_cell(point) == "71.0% ± 2.0%, classifiers on NVIDIA H200"
    assert any("DP-Kernel | 70.0%" in line for line in module.published_table())


def test_frontier_merge_replaces_cell_by_cell_and_keeps_measured_points(monkeypatch):
    """--merge adds one method's ∞ to a table holding its ε 1 and 10 (whose runs may be gone): the other
    cells stay, a rerun cell replaces its old point, and a not-run placeholder never erases a figure."""
    module = load_bench(ROOT / "bench" / "frontier.py", monkeypatch)
    before = [
        {"strategy": "dp-merf", "target": 10, "gen2real_cnn": 0.7},
        {"strategy": "gswgan", "target": 1, "gen2real_cnn": 0.05},
        {"strategy": "gswgan", "target": 10, "gen2real_cnn": 0.3},
        {"strategy": "gswgan", "target": 10, "lever": "as published", "gen2real_cnn": 0.2},
    ]
    rows = [
        {"strategy": "gswgan", "target": 1, "error": "not run (--collect-only)"},
        {"strategy": "gswgan", "target": 10, "gen2real_cnn": 0.4},
        {"strategy": "gswgan", "target": float("inf"), "gen2real_cnn": 0.6},
    ]
    merged = module.merge_points(before, rows)
    cells = [(r["strategy"], r["target"], r.get("lever"), r.get("gen2real_cnn")) for r in merged]
    assert cells == [
        ("dp-merf", 10, None, 0.7),
        ("gswgan", 1, None, 0.05),
        ("gswgan", 10, None, 0.4),
        ("gswgan", float("inf"), None, 0.6),
        ("gswgan", 10, "as published", 0.2),
    ]


def test_scale_runs_an_inprocess_arm(tmp_path, monkeypatch):
    """bench/scale.py's timing wrapper once lacked the transport's setup_totals: every arm failed."""
    module = load_bench(ROOT / "bench" / "scale.py", monkeypatch)
    out = tmp_path / "scale.json"
    module.main(["--transports", "inprocess", "--ks", "3", "--steps", "4", "--skip", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["summary"]
    assert "error" not in row and row["k"] == 3 and row["step_s"] > 0


def test_scale_k_runs_both_methods_and_alternates_the_order_of_k(tmp_path, monkeypatch, capsys):
    module = load_bench(ROOT / "bench" / "scale_k.py", monkeypatch)
    order = module.arm_order(["gswgan", "dp-merf"], [10, 100], repeats=3, merf_repeats=1)
    assert order == [("gswgan", 10), ("dp-merf", 10), ("gswgan", 100), ("dp-merf", 100)] + [
        ("gswgan", 100),
        ("gswgan", 10),
        ("gswgan", 10),
        ("gswgan", 100),
    ]
    out = tmp_path / "scale-k.json"
    argv = ["--ks", "3,4", "--steps", "4", "--skip", "1", "--merf-steps", "2", "--repeats", "1", "--out", str(out)]
    assert module.main(argv) == 0
    rows = {(r["method"], r["k"]): r for r in json.loads(out.read_text())["summary"]}
    assert rows[("gswgan", 4)]["step_ratio"] > 0 and rows[("gswgan", 3)]["step_ratio"] == 1.0
    assert rows[("dp-merf", 4)]["releases"] == 4 and rows[("dp-merf", 4)]["collection_rounds"] == 1
    assert all(r["peak_rss_mib"] > 0 and r["rss_goal_met"] for r in rows.values())
    assert "scale_k: " in capsys.readouterr().out


def test_one_shot_ceiling_scores_a_pooled_fit_under_the_whole_protocol(monkeypatch):
    """The pooled fit with --protocol-holdout, its quick and screen scores, and the whole protocol's
    three classifiers (a tiny recipe: the real one is a GPU's or an hour's work)."""
    import argparse
    import dataclasses

    from common.evaluation.anchors import RECIPES
    from common.methods import ExperimentConfig
    from simulations.cli import add_config_flags

    module = load_bench(ROOT / "bench" / "one_shot_ceiling.py", monkeypatch)
    flags = argparse.ArgumentParser()
    add_config_flags(flags)
    argv = ["--strategy", "dp-merf", "--dataset", "synthetic", "--model", "tiny", "--steps", "2", "--merf-dct", "0"]
    argv += ["--merf-features", "50", "--partition", "iid", "--protocol-holdout", "--device", "cpu"]
    cfg = ExperimentConfig(**vars(flags.parse_args(argv)))
    spec = dataclasses.replace(RECIPES["dpimagebench-cpu"], epochs=1, step_epochs=1, synthetic_size=240)
    row = module.fit_and_score(cfg, noise=0.0, protocol=spec, screen_n=120, eval_n=120)
    assert 0.0 <= row["cnn_10k"] <= 1.0 and 0.0 <= row["resnet8_screen"] <= 1.0 and row["fit_s"] > 0
    assert row["protocol"]["name"] == "dpimagebench-cpu"
    assert set(row["protocol"]["per_network"]) == {"resnet", "wrn", "resnext"}
    accs = list(row["protocol"]["per_network"].values())
    assert row["protocol"]["mean"] == pytest.approx(sum(accs) / 3)


def test_gpu_protocol_runs_carries_slim_runs_and_takes_back_only_the_protocol_figures(tmp_path, monkeypatch):
    """pack keeps what `fedgan evaluate` reads (not the clients' states nor the optimizer's); unpack puts
    the GPU's protocol figures into the run's own eval.json, its quick figures untouched, and says so
    when a run's figures did not come back."""
    import tarfile

    import torch

    from common.io.tensor_files import load_tensors, save_tensors

    module = load_bench(ROOT / "scripts" / "gpu_protocol_runs.py", monkeypatch)
    runs = []
    for name in ("gswgan-eps10", "dp-ntk-eps1"):
        run = tmp_path / "work" / name
        (run / "clients").mkdir(parents=True)
        (run / "clients" / "0.pt").write_bytes(b"x" * 1000)
        ckpt = {"released_generator": {"w": torch.ones(3)}, "generator_optimizer": {"m": torch.zeros(1000)}}
        save_tensors(ckpt, run / "checkpoint.pt")
        for f in ("config.json", "summary.json", "privacy.json"):
            (run / f).write_text("{}")
        (run / "eval.json").write_text(json.dumps({"fid": {"value": 119.0}}))
        runs.append(run)
    copies = module.pack(runs, carry=tmp_path / "carry")
    assert sorted(p.name for p in copies[0].iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "summary.json",
    ]
    assert set(load_tensors(copies[0] / "checkpoint.pt")) == {"released_generator"}
    with pytest.raises(SystemExit, match="share a folder name"):
        module.pack([runs[0], runs[0]], carry=tmp_path / "carry")

    back = tmp_path / "back"
    (back / "evaluate").mkdir(parents=True)
    got = {"protocol": "dpimagebench-cpu", "mean": 0.4, "std": 0.02, "device": "NVIDIA H200"}
    (back / "evaluate" / "gswgan-eps10.eval.json").write_text(json.dumps({"fid": {"value": None}, "protocol": got}))
    (back / "evaluate" / "dp-ntk-eps1.log").write_text("Traceback: out of memory\n")
    with tarfile.open(back / "evaluate.tar.gz", "w:gz") as tar:
        tar.add(back / "evaluate", arcname="evaluate")
    for f in (back / "evaluate").iterdir():
        f.unlink()
    outcome = module.unpack(back, runs)
    assert outcome["gswgan-eps10"] == "dpimagebench-cpu: 40.0% ± 2.0% on NVIDIA H200"
    assert "no protocol figures came back" in outcome["dp-ntk-eps1"]
    local = json.loads((runs[0] / "eval.json").read_text())
    assert local == {"fid": {"value": 119.0}, "protocol": got}
    assert "protocol" not in json.loads((runs[1] / "eval.json").read_text())
    assert (runs[1] / "protocol-gpu.log").read_text().startswith("Traceback")


def test_critic_warm_start_measures_both_arms_against_the_reference(tmp_path, monkeypatch, capsys):
    """The warm-start benchmark on a tiny seeded run directory (config.json and a seed start without a
    critic, which the bench derives with --critic-steps, as a run would): each arm's answers are
    compared with an independent reference, and the seed critic's arm answers differently from
    scratch at n = 0 (it was loaded)."""
    from common.data import num_classes_for
    from common.io.tensor_files import save_tensors
    from common.learning.models import build_generator
    from common.methods.seeding import SeedStart
    from tests.helpers import tiny_cfg

    module = load_bench(ROOT / "bench" / "critic_warm_start.py", monkeypatch)
    cfg = tiny_cfg(tmp_path, num_clients=4, init_release="dp-merf", init_epsilon=2.0, target_epsilon=10.0)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    G = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes_for(cfg))
    save_tensors(SeedStart(G.state_dict(), torch.zeros(1), 4).state_dict(), tmp_path / "seed_start.pt")
    out = tmp_path / "cws.json"
    argv = ["--run", str(tmp_path), "--clients", "2", "--grid", "0,3", "--reference", "6", "--critic-steps", "2"]
    argv += ["--out", str(out)]
    assert module.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["clients"] == [0, 2] and len(result["ceilings"]) == 2
    for arm in ("scratch", "critic"):
        assert set(result["agreement"][arm]) == {"0", "3"}
        assert all(-1.0 <= v <= 1.0 for v in result["per_client"][arm]["0"])
    assert result["per_client"]["scratch"]["0"] != result["per_client"]["critic"]["0"]
    assert all(-1.0 <= v <= 1.0 for arm in ("scratch", "critic") for v in result["between_clients"][arm].values())
    assert "critic_warm_start: ceiling" in capsys.readouterr().out


def test_stage2_from_seed_runs_stage_two_again_from_a_finished_seed(tmp_path, monkeypatch):
    """A finished seeded run's seed stage is copied, not run again, and stage 2 runs under the changes."""
    from simulations.cli import main as fedgan
    from tests.helpers import SEEDED_TINY, tiny_flags

    first = tmp_path / "first"
    assert fedgan(["simulate", *tiny_flags(**SEEDED_TINY, out=first)]) == 0
    module = load_bench(ROOT / "bench" / "stage2_from_seed.py", monkeypatch)
    again = tmp_path / "again"
    argv = ["--from", str(first), "--out", str(again), "--transport", "inprocess"]
    assert module.main([*argv, "--set", "init_weight=7.5", "--set", "steps=4"]) == 0
    cfg = json.loads((again / "config.json").read_text())
    assert cfg["init_weight"] == 7.5 and cfg["steps"] == 4 and cfg["out"] == str(again)
    assert (again / "seed" / "summary.json").read_text() == (first / "seed" / "summary.json").read_text()
    summary = json.loads((again / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 4
    stages = {s["stage"] for s in json.loads((again / "privacy.json").read_text())["stages"]}
    assert stages == {"seed", "refinement", "total"}  # the copied seed is still accounted for
    assert module.main([*argv]) == 2  # the new run exists now: refused, nothing overwritten
    assert module.main(["--from", str(first), "--out", str(tmp_path / "x"), "--set", "no_such=1"]) == 2
    assert not (tmp_path / "x").exists()


def test_release_noise_measures_what_the_secure_sums_calibration_predicts(tmp_path, monkeypatch, capsys):
    """A DP-MERF run through secure sums: its released mean's noise, measured against the pooled
    mean of the same images (no clipping at S = 1), is the 2S·σ/√(K·t) of its shares, not σ·2S/K."""
    from simulations.cli import main as fedgan
    from tests.helpers import tiny_flags

    run = tmp_path / "run"
    changes = dict(strategy="dp-merf", num_clients=9, steps=2, target_epsilon=10.0, merf_clip=1.0, merf_features=40)
    assert fedgan(["simulate", *tiny_flags(**changes, out=run, secure_aggregation=True, secagg_cohort=3)]) == 0
    module = load_bench(ROOT / "bench" / "release_noise.py", monkeypatch)
    out = tmp_path / "noise.jsonl"
    assert module.main([str(run), "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["num_clients"] == 9 and row["coordinates"] == 10 * 81
    assert 0.8 < row["noise_std"] / row["predicted_std"] < 1.25  # three sums of 3: σ·2S/K would read 0.47
    K, t = 9, row["mechanism"]["t"]
    assert row["predicted_std"] == pytest.approx(2 * row["mechanism"]["σ"] / (K * t) ** 0.5)  # S = 1
    assert "release noise" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not found"):
        module.main([str(tmp_path / "missing"), "--out", str(out)])
