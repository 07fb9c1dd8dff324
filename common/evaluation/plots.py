"""Figures of a run: ε per client, ε vs FID, training curves, bytes per step, sample grids.

Every function draws on its own ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, so no
display, no global figure registry and no backend switch for the rest of the process), writes one
PNG atomically (temporary file + rename, so a reader never sees half an image) and returns its path.

Inputs are the plain dicts of the run directory (``summary.json``, ``metrics.jsonl`` rows): keys
may be missing and ε may be ``null`` (unbounded against an untrusted server: docs/privacy.md), and every
function draws what it has instead of failing on a partial run.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from common.evaluation.beside import AMPLIFIED_KIND, HEADLINE_KIND, BesideFigure, headline_kind

DPI = 120
MAX_BARS = 60  # above this many clients the per-client ε becomes a histogram
METRIC_LABELS = {  # metric -> (short name for titles, axis label)
    "fid": ("FID", "FID, Inception pool3 features (lower is better)"),
    "fid_domain": ("Domain FID", "domain FID, project classifier features (lower is better)"),
    "inception_score": ("Inception Score", "Inception Score (higher is better)"),
}


# --- helpers ---------------------------------------------------------------------------------------
def _new_figure(width_in: float, height_in: float, nrows: int = 1, ncols: int = 1, **kw: Any):
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def _save(fig: Figure, path: Path) -> Path:
    """PNG to a temporary file in the target folder, then renamed: atomic on POSIX."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        fig.clear()  # a Figure outside pyplot is freed with its last reference; drop the artists now
    return path


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (null, NaN, ∞, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def format_bytes(n: float | None) -> str:
    """Decimal units, as network traffic is usually quoted: 605722 -> '606 kB'."""
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _delta_text(delta: Any) -> str:
    return f"δ = {delta:g}" if finite_or_none(delta) is not None else "δ not recorded"


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4", wrap=True)
    # tick_params, not set_xticks([]): a panel sharing its x axis must keep its neighbour's ticks
    ax.tick_params(left=False, bottom=False, labelleft=False, labelbottom=False)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# --- ε per client ----------------------------------------------------------------------------------
def client_epsilons(summary: dict) -> list[tuple[Any, float | None, int]]:
    """(client id, ε, queries) per client: 0 for a client that answered nothing, None when unbounded."""
    rows = []
    for i, client in enumerate(summary.get("clients") or []):
        queries = int(client.get("queries") or 0)
        eps = 0.0 if queries == 0 else finite_or_none(client.get("epsilon"))
        rows.append((client.get("client_id", i), eps, queries))
    return rows


def plot_epsilon_per_client(summary: dict, path: Path) -> Path:
    """Per-client ε (the headline's kind), sorted bars up to 60 clients, a histogram above that.

    Unbounded clients (ε null: the server sees raw updates) are drawn as hatched bars reaching the top
    and counted in the title; the figure beside the headline (``epsilon_amplified``) is a dashed line
    named by its kind: the amplified ε as the assumption it is, a secure run's figure as the ε against
    a server that deviates from the secure sum (``beside.py``).
    """
    rows = client_epsilons(summary)
    finite = sorted((r for r in rows if r[1] is not None), key=lambda r: r[1])
    unbounded = [r for r in rows if r[1] is None]
    amp = finite_or_none((summary.get("epsilon_amplified") or {}).get("epsilon"))
    beside = BesideFigure.of(summary)
    idle = sum(r[2] == 0 for r in rows)
    fig, axes = _new_figure(9, 4.8)
    ax = axes[0, 0]
    notes = [_plural(len(rows), "client"), f"{idle} answered no query (ε = 0)"]
    if unbounded:
        notes.append(f"{len(unbounded)} unbounded (ε = ∞, raw updates visible to the server)")
    strategy = summary.get("strategy")
    ax.set_title(
        f"ε {headline_kind(summary)} ({_delta_text(summary.get('delta'))}"
        f"{', ' + str(strategy) if strategy else ''})\n" + " · ".join(notes),
        fontsize=11,
    )
    if not rows:
        _no_data(ax, "no clients in summary.json")
    elif len(rows) <= MAX_BARS:
        _epsilon_bars(ax, finite, unbounded, amp, beside)
    else:
        _epsilon_histogram(ax, [r[1] for r in finite], amp, beside)
    if amp is not None and beside.amplified and finite and amp > finite[-1][1]:
        ax.text(0.5, 0.97, AMPLIFIED_ABOVE_HINT, transform=ax.transAxes, ha="center", va="top", fontsize=9, color="0.3")
    return _save(fig, path)


AMPLIFIED_ABOVE_HINT = (
    "the amplified ε is above every per-client ε: at this noise sampling cannot help (σ/√B too small)"
)


def _epsilon_bars(ax, finite: list, unbounded: list, amp: float | None, beside: BesideFigure) -> None:
    values = [r[1] for r in finite]
    top = max(values + ([amp] if amp is not None else []) + [0.0]) * 1.12 or 1.0
    x = np.arange(len(finite) + len(unbounded))
    answered = [i for i, r in enumerate(finite) if r[2] > 0]
    idle = [i for i, r in enumerate(finite) if r[2] == 0]
    small = len(x) > 20
    if answered:
        ax.bar(x[answered], [values[i] for i in answered], color="C0", label="ε of the client's own queries")
    if idle:  # zero-height bars are invisible: mark the slot
        ax.bar(x[idle], [0.0] * len(idle), color="0.6", label="no query answered (ε = 0)")
        for i in idle:
            ax.text(x[i], top * 0.01, "0", ha="center", va="bottom", color="0.4", fontsize=7 if small else 9)
    if unbounded:
        xs = x[len(finite) :]
        ax.bar(
            xs,
            [top] * len(unbounded),
            color="none",
            edgecolor="C3",
            hatch="//",
            label="unbounded (ε = ∞, no guarantee against the server)",
        )
        for xi in xs:
            ax.text(
                xi,
                top * 0.5,
                "∞",
                ha="center",
                va="center",
                color="C3",
                fontsize=10 if small else 16,
                bbox=dict(facecolor="white", edgecolor="none", pad=1),
            )
    if amp is not None:
        ax.axhline(amp, color="C3", linestyle="--", linewidth=1.5, label=beside.legend(amp))
    ax.set_ylim(0, top)
    ax.set_xlim(-0.6, len(x) - 0.4)
    ax.set_xticks(x, [str(r[0]) for r in finite + unbounded], rotation=90 if small else 0, fontsize=7 if small else 10)
    ax.set_xlabel("client id (sorted by ε)")
    ax.set_ylabel("ε (per client, no amplification)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2 if small else -0.14), ncol=2, fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _epsilon_histogram(ax, values: list[float], amp: float | None, beside: BesideFigure) -> None:
    if values:
        ax.hist(values, bins=min(30, max(5, len(set(values)))), color="C0", edgecolor="white", label="clients")
    if amp is not None:
        ax.axvline(amp, color="C3", linestyle="--", linewidth=1.5, label=beside.legend(amp))
    ax.set_xlabel("ε per client (no amplification)")
    ax.set_ylabel("number of clients")
    if values or amp is not None:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)


# --- ε vs FID --------------------------------------------------------------------------------------
def _metric_value(value: Any) -> tuple[float | None, float | None]:
    """(value, error bar) from a number, an ``[mean, std]`` pair or a ``{"mean", "std"}``/``{"value"}`` dict."""
    if isinstance(value, dict):
        if "mean" in value:
            return finite_or_none(value.get("mean")), finite_or_none(value.get("std"))
        return finite_or_none(value.get("value")), None
    if isinstance(value, (list, tuple)) and value:
        return finite_or_none(value[0]), finite_or_none(value[1]) if len(value) > 1 else None
    return finite_or_none(value), None


ONE_POINT_HINT = "one evaluated checkpoint: run with --eval-every N for a curve"
NO_CRITIC_HINT = (
    "the critic's statistics stay on the clients (private);\n--client-stats sends them (NOT PRIVATE, debugging only)"
)


def plot_epsilon_vs_fid(
    points: list[dict],
    path: Path,
    *,
    metric: str = "fid",
    delta: float | None = None,
    kind: str = HEADLINE_KIND,
) -> Path:
    """``metric`` of checkpoints of one run against the ε spent by then (max over clients).

    ``points`` are ``{"step", "epsilon_max", metric}`` (``delta`` may ride along in each point);
    points where either value is missing or None are left out and counted in the title. ``kind`` is
    the headline's (``headline_kind``): the axis says what the ε is against.
    """
    delta = delta if delta is not None else next((p["delta"] for p in points if "delta" in p), None)
    data = []
    for p in points:
        eps = finite_or_none(p.get("epsilon_max"))
        value, err = _metric_value(p.get(metric))
        if eps is not None and value is not None:
            data.append((p.get("step"), eps, value, err))
    data.sort(key=lambda d: (d[1], d[0] if d[0] is not None else -1))
    fig, axes = _new_figure(7.5, 5)
    ax = axes[0, 0]
    name, label = METRIC_LABELS.get(metric, (metric, metric))
    skipped = len(points) - len(data)
    ax.set_title(
        f"{name} vs privacy spent ({_delta_text(delta)})"
        + (f"\n{skipped} of {len(points)} checkpoints without a value left out" if skipped else ""),
        fontsize=11,
    )
    if not data:
        _no_data(ax, f"no checkpoint has both ε and {metric}")
        return _save(fig, path)
    steps, eps, values, errs = zip(*data, strict=False)
    ax.errorbar(
        eps,
        values,
        yerr=[e or 0.0 for e in errs] if any(errs) else None,
        marker="o",
        color="C0",
        capsize=3,
        linewidth=1.5,
    )
    every = max(1, math.ceil(len(data) / 12))
    for i, (step, x, y, _) in enumerate(data):
        if step is not None and (i % every == 0 or i == len(data) - 1):
            ax.annotate(f"step {step}", (x, y), textcoords="offset points", xytext=(5, 6), fontsize=8)
    if len(data) > 1 and min(eps) > 0 and max(eps) / min(eps) > 50:
        ax.set_xscale("log")
    ax.margins(x=0.15, y=0.15)
    ax.set_xlabel(f"ε spent, max over clients ({kind.removeprefix('per client, ')})")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if len(data) == 1:  # only the end of the run was evaluated: one point, say how to get a curve
        ax.text(0.5, 0.04, ONE_POINT_HINT, transform=ax.transAxes, ha="center", fontsize=9, color="0.35")
    return _save(fig, path)


# --- training curves -------------------------------------------------------------------------------
def _series(metrics: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key``, skipping rows without it; a repeated step keeps its last row."""
    by_step: dict[float, float] = {}
    for row in metrics:
        step, value = finite_or_none(row.get("step")), finite_or_none(row.get(key))
        if step is not None and value is not None:
            by_step[step] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plot_training_curves(
    metrics: list[dict],
    path: Path,
    *,
    delta: float | None = None,
    beside_kind: str = AMPLIFIED_KIND,
    kind: str = HEADLINE_KIND,
) -> Path:
    """ε (max, median and the figure beside the headline, named by ``beside_kind``: summary.json's
    ``epsilon_amplified.kind``) and the Wasserstein estimate against the generator step. The title
    names the headline's ``kind`` (``headline_kind``): a secure run's is not "untrusted server"."""
    fig, axes = _new_figure(8, 6.5, nrows=2, sharex=True)
    ax_eps, ax_w = axes[0, 0], axes[1, 0]
    drawn = False
    for key, label, style in (
        ("privacy/epsilon_max", "ε max over clients", dict(color="C3")),
        ("privacy/epsilon_median", "ε median over clients", dict(color="C0")),
        ("privacy/epsilon_amplified", BesideFigure(beside_kind).name, dict(color="C3", linestyle=":")),
    ):
        steps, values = _series(metrics, key)
        if steps:
            ax_eps.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label, **style)
            drawn = True
    ax_eps.set_title(f"Privacy spent ({_delta_text(delta)}; ε {kind})", fontsize=11)
    if drawn:
        ax_eps.legend(fontsize=9)
        ax_eps.set_ylabel("ε")
        ax_eps.grid(alpha=0.3)
    else:
        _no_data(ax_eps, "no privacy/epsilon_* values in metrics.jsonl")
    steps, values = _series(metrics, "train/wasserstein")
    ax_w.set_title("Critic's Wasserstein estimate", fontsize=11)
    if steps:
        ax_w.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, color="C2")
        ax_w.axhline(0, color="0.5", linewidth=0.8)
        ax_w.set_ylabel("E[D(real)] − E[D(fake)]\n(critic output units)")
        ax_w.grid(alpha=0.3)
    else:
        _no_data(ax_w, NO_CRITIC_HINT)
    ax_w.set_xlabel("generator step")
    ax_w.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax_w.tick_params(bottom=True, labelbottom=True)
    return _save(fig, path)


# --- bytes per step --------------------------------------------------------------------------------
def _bytes_per_step(run: dict) -> dict:
    comm = run.get("comm") or {}
    return comm.get("bytes_per_step") or run.get("bytes_per_step") or {}


def plot_bytes_per_step(runs: list[dict], path: Path) -> Path:
    """Bytes per generator step per participating client, down and up, one bar group per run.

    Each run is a ``summary.json`` dict (or anything with ``comm.bytes_per_step`` or
    ``bytes_per_step``); its label is ``run["label"]``, else its strategy. Log scale: Fed-Avg GAN
    ships whole discriminators and is orders of magnitude above GS-WGAN.
    """
    labels = [str(r.get("label") or r.get("strategy") or f"run {i + 1}") for i, r in enumerate(runs)]
    fig, axes = _new_figure(max(6.0, 1.6 * len(runs) + 3), 4.8)
    ax = axes[0, 0]
    ax.set_title("Communication per generator step, per participating client", fontsize=11)
    per_run = [_bytes_per_step(r) for r in runs]
    known = [
        v
        for b in per_run
        for v in (finite_or_none(b.get("down")), finite_or_none(b.get("up")))
        if v is not None and v > 0
    ]
    if not known:
        _no_data(ax, "no bytes_per_step in the runs given")
        return _save(fig, path)
    x, width = np.arange(len(runs)), 0.38
    for offset, key, color, name in (
        (-width / 2, "down", "C0", "down (server → client)"),
        (width / 2, "up", "C1", "up (client → server)"),
    ):
        vals = [finite_or_none(b.get(key)) for b in per_run]
        shown = [v if v is not None and v > 0 else np.nan for v in vals]
        bars = ax.bar(x + offset, shown, width, color=color, label=name)
        for bar, v in zip(bars, vals, strict=False):
            y = v if v is not None and v > 0 else min(known)
            ax.annotate(
                format_bytes(v) if v is not None and v > 0 else "n/a",
                (bar.get_x() + width / 2, y),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=8,
            )
    ax.set_yscale("log")
    ax.set_ylim(min(known) / 3, max(known) * 6)
    ax.set_xticks(x, labels)
    ax.set_ylabel("bytes per step (log scale)")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", which="major", alpha=0.3)
    return _save(fig, path)
