"""summary.json and privacy.json, built from the strategy's privacy report and what the loop counted,
and the table printed at the end of a run.

Both documents are the JSON mappings of ``RunSummary`` and ``PrivacyReport`` in
``protos/fedgan.proto`` (field names as written there; a test parses every run's files strictly).
Every ε in them comes from the strategy's report, which builds it from ledgers
(``common/privacy/statement.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.evaluation.beside import headline_kind
from common.evaluation.measured import SEEDED, measured_sentence
from common.evaluation.report_text import wall_text
from common.methods import ExperimentConfig, method
from common.privacy.statement import DO_NOT_PUBLISH, KIND_EXAMPLE, epsilon_meaning

from .release import READERS_PRIVATE


@dataclass
class RunFacts:
    """What the loop knows at the end of a run, for summary.json."""

    status: str
    transport: str
    steps_completed: int
    comm: dict[str, Any]
    wall_s: float
    step_times: list[float]
    failures: dict[int, str]
    notes: list[str]
    run_dir: str
    bytes_down: dict[int, int] = field(default_factory=dict)
    bytes_up: dict[int, int] = field(default_factory=dict)
    prior_wall_s: float = 0.0  # a seeded run: stage 1's wall time and the server's critic, before this loop


def privacy_document(cfg: ExperimentConfig, report: dict[str, Any]) -> dict[str, Any]:
    """privacy.json: every client's ledger and figures, the server's ledger, rules and statement."""
    return {
        "readers": READERS_PRIVATE,
        "delta": cfg.delta,
        "accountant": cfg.accountant,
        "epsilon_kind": report["epsilon_kind"],
        "accounting": report["accounting"],
        "statement": report["statement"],
        "not_private": report["not_private"],
        "do_not_publish": DO_NOT_PUBLISH,
        "epsilon_amplified": report["epsilon_amplified"],
        "method": {cfg.strategy: report["parameters"]},
        "stages": report.get("stages", []),
        "clients": [
            {
                k: c.get(k)
                for k in ("client_id", "queries", "epsilon", "epsilon_reason", "epsilon_rdp", "epsilon_prv", "ledger")
            }
            for c in report["clients"]
        ],
    }


def summary_document(cfg: ExperimentConfig, report: dict[str, Any], facts: RunFacts) -> dict[str, Any]:
    """summary.json: the run, its clients (bytes, status, ε), ε, bytes per step, latency, notes."""
    clients = [
        {**{k: v for k, v in c.items() if k != "ledger"}, **_client_facts(c["client_id"], facts)}
        for c in report["clients"]
    ]
    return {
        "readers": READERS_PRIVATE,
        "strategy": cfg.strategy,
        "status": facts.status,
        "transport": facts.transport,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "model": cfg.model,
        "steps_completed": facts.steps_completed,
        "steps_planned": cfg.steps,
        "num_clients": cfg.num_clients,
        "participants": cfg.participants(),
        "batch_size": cfg.batch_size,
        "delta": cfg.delta,
        "accountant": cfg.accountant,
        "epsilon_kind": report["epsilon_kind"],
        "accounting": report["accounting"],
        "mechanism": report["mechanism"],
        "method": {cfg.strategy: report["parameters"]},
        "not_private": report["not_private"],
        "clients": clients,
        "epsilon_max": report["epsilon_max"],
        "epsilon_amplified": {k: v for k, v in report["epsilon_amplified"].items() if k != "ledger"},
        "comm": facts.comm,
        "wall_s": round(facts.wall_s, 3),
        "prior_wall_s": round(facts.prior_wall_s, 3),
        "step_latency_s": step_latency(facts.step_times),
        "failed_clients": sorted(facts.failures),
        "run_dir": facts.run_dir,
        "notes": facts.notes,
        "privacy_statement": report["statement"],
        "stages": report.get("stages", []),
    }


def _client_facts(cid: int, facts: RunFacts) -> dict[str, Any]:
    return {
        "bytes_down": facts.bytes_down.get(cid, 0),
        "bytes_up": facts.bytes_up.get(cid, 0),
        "status": "failed" if cid in facts.failures else "ok",
        "failure": facts.failures.get(cid, ""),
    }


def epsilon_stats(report: dict[str, Any]) -> tuple[float | None, float | None]:
    """(max, median) per-client ε over queried clients; None when any of them is unbounded."""
    eps = [c["epsilon"] for c in report["clients"] if c["queries"] > 0] or [0.0]
    if any(e is None for e in eps):
        return None, None
    return max(eps), float(np.median(eps))


def step_latency(times: list[float]) -> dict[str, Any]:
    """Median and 90th percentile wall time of a generator step (the whole round: send, client
    work, replies, server update), over the steps this run directory has taken."""
    if not times:
        return {"median": None, "p90": None, "mean": None, "steps": 0}
    t = np.asarray(times)
    return {
        "median": float(np.median(t)),
        "p90": float(np.percentile(t, 90)),
        "mean": float(t.mean()),
        "steps": int(t.size),
    }


def print_summary(summary: dict[str, Any]) -> None:
    print(format_summary_table(summary), flush=True)


def _latency_text(latency: dict[str, Any]) -> str:
    if not latency.get("steps"):
        return "n/a (no step taken)"
    return f"median {latency['median']:.3g} s · p90 {latency['p90']:.3g} s per step"


def format_summary_table(summary: dict[str, Any]) -> str:
    """The table printed at the end of a run (every ε as summary.json states it, from the ledgers)."""
    eps = [c["epsilon"] for c in summary["clients"] if c["queries"] > 0] or [0.0]
    if any(e is None for e in eps):
        reason = next((c.get("epsilon_reason") for c in summary["clients"] if c["epsilon"] is None), "")
        eps_text = reason or "unbounded"
    else:
        eps_sorted = sorted(eps)
        eps_text = f"min {eps_sorted[0]:.4g} · median {float(np.median(eps_sorted)):.4g} · max {eps_sorted[-1]:.4g}"
    per_step = summary["comm"]["bytes_per_step"]
    amp = summary.get("epsilon_amplified", {})
    kind = headline_kind(summary)
    accountant = summary.get("accountant", "rdp").upper()
    if amp.get("epsilon") is not None and amp.get("sampling") in ("", "none"):  # no sampling to assume
        amp_text = f"{amp['epsilon']:.4g}  [{amp.get('kind', '')}]"
    elif amp.get("epsilon") is not None:
        sampling = {"wor": "without replacement", "poisson": "Poisson"}.get(amp.get("sampling", ""), "")
        amp_text = (
            f"{amp['epsilon']:.4g}  [assumes the server samples in secret{', ' + sampling if sampling else ''}; "
            f"largest q = {amp.get('sample_rate', float('nan')):.3g}]"
        )
    else:
        amp_text = amp.get("epsilon_reason") or ("n/a: " + amp.get("assumption", ""))
    rows = [
        ("strategy", summary["strategy"]),
        ("status", summary["status"]),
        (method(summary["strategy"]).step_label, f"{summary['steps_completed']} / {summary['steps_planned']}"),
        ("clients queried", f"{sum(c['queries'] > 0 for c in summary['clients'])} of {summary['num_clients']}"),
        (f"ε {kind} (δ={summary['delta']:g}, {accountant})", eps_text),
        ("ε rule", summary["accounting"]),
        ("ε means", _meaning(summary, None if None in eps else max(eps), kind)),
        (f"ε {amp.get('kind') or 'amplified'}", amp_text),
        ("bytes / step / client", f"down {per_step['down']:,.0f} · up {per_step['up']:,.0f}"),
        ("bytes total", f"down {summary['comm']['bytes_down_total']:,} · up {summary['comm']['bytes_up_total']:,}"),
        ("wall time", wall_text(summary["wall_s"], summary.get("prior_wall_s"), lambda s: f"{s:.1f} s")),
        ("step latency", _latency_text(summary.get("step_latency_s") or {})),
        ("run directory", summary["run_dir"]),
    ]
    if summary.get("stages"):  # a seeded run: each stage's share beside the total
        rows.insert(5, ("ε by stage", stage_text(summary["stages"], summary.get("epsilon_kind", ""))))
    failed = [c for c in summary["clients"] if c.get("status") == "failed"]
    if failed:
        rows.insert(4, ("failed clients", "; ".join(f"{c['client_id']} ({c['failure']})" for c in failed)))
    if summary.get("not_private"):
        rows.insert(0, ("NOT PRIVATE", "; ".join(summary["not_private"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _meaning(summary: dict[str, Any], epsilon: float | None, kind: str) -> str:
    """What the headline ε bounds, and what this method measured near it (a seeded run: the seeded
    method's points)."""
    stages = summary.get("stages") or []
    name = summary["strategy"]
    if stages:
        name = SEEDED.format(method=name, seed=stages[0].get("method", "?"))
    return epsilon_meaning(epsilon, delta=summary["delta"], kind=kind, measured=measured_sentence(name, epsilon))


def stage_text(stages: list[dict[str, Any]], kind: str) -> str:
    """A seeded run's shares, worst client of each (DPGAN: its curator's one ledger): "seed (dp-merf) 1
    · refinement (gswgan) 9.6 · total 10" (the total composes both in one ledger: less than the sum)."""

    def fmt(eps: float | None) -> str:
        return "unbounded" if eps is None else f"{eps:.4g}"

    parts = [
        f"{s['stage']} ({s['method']}) {fmt(s['epsilon_max'])}"
        if s["stage"] != "total"
        else f"total {fmt(s['epsilon_max'])}"
        for s in stages
    ]
    if kind == KIND_EXAMPLE:  # DPGAN: one curator's ledger holds both
        return " · ".join(parts) + "  [one curator's example-level ledger; the total composes both in it]"
    return " · ".join(parts) + "  [worst client of each; the total composes both in each client's ledger]"
