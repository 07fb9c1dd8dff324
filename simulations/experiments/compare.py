"""``fedgan compare``: every method on the same data, partition and seed.

Each strategy runs with its own privacy parameters through the same loop and client app, is evaluated
like any run (unless ``--no-eval``), and ends up in ``comparison.json`` (one entry per strategy with
its run directory and its summary.json content) plus a table and a bytes-per-step plot. Bytes are
the measured ones from each run, never computed from parameter counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.channels import SUMS
from common.evaluation.plots import plot_bytes_per_step
from common.methods import METHODS, ExperimentConfig, method, prepare, run_terms
from common.options import ConfigError
from common.privacy.policy import load_policy
from server.reporting import RunDirectory, RunDirectoryError, atomic_write_json, check_writable, next_run_dir

from .simulate import _run_flower, _run_inprocess

STRATEGY_ORDER = tuple(METHODS)


def generator_steps(summary: dict[str, Any], cfg: ExperimentConfig) -> int:
    """Generator updates that ran (Fed-Avg GAN takes several per round: its core says how many)."""
    return method(summary["strategy"]).generator_updates(cfg, summary["steps_completed"])


def method_config(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """``name``'s run in the comparison, prepared (its own --target-epsilon noise), in a form the
    nodes' policy accepts: where the user chose no release channel and the nodes refuse the method's
    releases in the clear (Fed-Avg GAN's raw deltas are unbounded against the server; the default
    policy refuses them), it runs through secure sums, bounded per client, if it has that form. The
    table labels each ε with its own unit either way."""
    scfg = prepare(cfg.replace(strategy=name))
    if cfg.release_channel or cfg.secure_aggregation:
        return scfg
    policy = load_policy({})
    if not policy.violations(scfg, run_terms(scfg)) or SUMS not in method(name).channel_needs:
        return scfg
    try:
        secure = prepare(cfg.replace(strategy=name, secure_aggregation=True))
    except ConfigError:  # no secure form fits (e.g. fewer than 3 clients a round): the nodes say why they refuse
        return scfg
    return secure if not policy.violations(secure, run_terms(secure)) else scfg


def run_one(
    cfg: ExperimentConfig, out: Path, name: str, transport: str, node_state: str | Path | None = None
) -> dict[str, Any]:
    scfg = method_config(cfg, name).replace(out=str(out / name))
    run = RunDirectory.create(scfg, state_dir=node_state)
    runner = _run_inprocess if transport == "inprocess" else _run_flower
    _, error = runner(scfg, run, False)
    entry: dict[str, Any] = {"strategy": name, "run_dir": str(run.path)}
    if error is not None:
        entry["error"] = f"{type(error).__name__}: {error}"
        return entry
    entry["summary"] = json.loads((run.path / "summary.json").read_text())
    entry["generator_steps"] = generator_steps(entry["summary"], scfg)
    per_round = entry["summary"]["comm"]["bytes_per_step"]
    entry["bytes_per_generator_step"] = {
        k: v * entry["summary"]["steps_completed"] / max(entry["generator_steps"], 1) for k, v in per_round.items()
    }
    if cfg.eval:
        from .evaluate import METRICS, evaluate_run

        result = evaluate_run(run.path, progress=cfg.progress)
        entry["eval"] = {k: result[k] for k in METRICS if k in result}
    return entry


def compare(
    cfg: ExperimentConfig,
    *,
    transport: str = "flower",
    strategies: tuple[str, ...] = STRATEGY_ORDER,
    node_state: str | Path | None = None,
) -> dict[str, Any]:
    """Each method on the same data, seed and nodes' policy. ``node_state``: one place for the
    simulated nodes of every method (their ledgers then compose the methods' releases, and a node's
    budget spans them all); default: each method's own run directory (independent worlds)."""
    out = Path(cfg.out) if cfg.out else next_run_dir("runs", cfg.replace(strategy="compare"))
    check_new_compare_dir(out)
    entries = []
    for i, name in enumerate(strategies, 1):
        print(f"[{i}/{len(strategies)}] {name}: running in {out / name}", flush=True)
        entries.append(run_one(cfg, out, name, transport, node_state))
        print(f"[{i}/{len(strategies)}] {name}: {_one_line(entries[-1])}", flush=True)
    finished = [e["summary"] for e in entries if "summary" in e]
    result = {
        "dir": str(out),
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "seed": cfg.seed,
        "num_clients": cfg.num_clients,
        "strategies": entries,
    }
    if finished:
        result["bytes_plot"] = str(plot_bytes_per_step(finished, out / "bytes_per_step.png"))
    atomic_write_json(out / "comparison.json", result)
    return result


def check_new_compare_dir(out: Path) -> None:
    """``out`` may receive a new comparison: it does not exist or is an empty folder, and a file can
    be written there (it is made if missing). Checked before any training, not after the first run."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirectoryError(
            f"--out {out} already exists: fedgan compare makes a new directory (one run per method inside it); "
            "choose another --out"
        )
    check_writable(out, "choose a writable --out")


def _one_line(entry: dict[str, Any]) -> str:
    """How one strategy's run ended, in a line (shown with or without progress bars)."""
    if "error" in entry:
        return f"failed: {entry['error']}"
    summary = entry["summary"]
    eps = summary.get("epsilon_max")
    return (
        f"{summary['status']}, {summary['steps_completed']} steps in {summary['wall_s']:.0f} s, "
        f"ε {'unbounded' if eps is None else format(eps, '.3g')} ({summary.get('epsilon_kind', '')})"
    )


def _eps_cells(summary: dict[str, Any]) -> tuple[str, str, str, str]:
    """(ε, its unit, amplified ε, its unit): each method's figures in their own privacy unit (DPGAN's
    headline is per example, the others' per client), never under one shared label."""
    head = summary.get("epsilon_max")
    amplified = summary.get("epsilon_amplified") or {}
    amp = amplified.get("epsilon")
    headline = "unbounded" if head is None else f"{head:.4g}"
    secondary = "n/a" if amp is None else f"{amp:.4g}"
    return headline, summary.get("epsilon_kind", ""), secondary, amplified.get("kind", "") if amp is not None else ""


def format_comparison(result: dict[str, Any]) -> str:
    header = (
        "strategy",
        "ε (max)",
        "ε unit",
        "ε amplified",
        "amplified unit",
        "bytes/G-step down",
        "bytes/G-step up",
        "bytes total",
        "wall s",
        "FID",
        "gen2real CNN",
    )
    rows = [header]
    for e in result["strategies"]:
        if "summary" not in e:
            rows.append((e["strategy"], "failed: " + e["error"][:60], *[""] * (len(header) - 2)))
            continue
        s, ev = e["summary"], e.get("eval", {})
        head, unit, amp, amp_unit = _eps_cells(s)
        fid = (ev.get("fid") or {}).get("value")
        g2r = (ev.get("gen2real_acc") or {}).get("cnn")
        rows.append(
            (
                e["strategy"],
                head,
                unit,
                amp,
                amp_unit,
                f"{e['bytes_per_generator_step']['down']:,.0f}",
                f"{e['bytes_per_generator_step']['up']:,.0f}",
                f"{s['comm']['bytes_down_total'] + s['comm']['bytes_up_total']:,}",
                f"{s['wall_s']:.1f}",
                "n/a" if fid is None else f"{fid:.1f}",
                "n/a" if g2r is None else f"{g2r:.1%}",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) for r in rows]
    rules = [f"{e['strategy']}: {e['summary']['accounting']}" for e in result["strategies"] if "summary" in e]
    return "\n".join(lines + ["", "ε rules (δ as configured):", *rules, "", f"comparison: {result['dir']}"])
