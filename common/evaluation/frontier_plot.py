"""The privacy–utility frontier's figure: a quality metric against ε, one line per method
(``bench/frontier.py`` draws it; the figures' conventions are ``plots.py``'s)."""

from __future__ import annotations

import math
from pathlib import Path

from .plots import METRIC_LABELS, _metric_value, _new_figure, _no_data, _save, finite_or_none


def frontier_series(rows: list[dict], metric: str) -> tuple[dict[str, list[tuple[float, float]]], float]:
    """Per strategy, the (ε, ``metric``) points sorted by ε, and the x where the ∞ points sit.

    A row whose target is ``inf`` (the run without noise) goes to 10x the largest finite ε of the
    other rows, whatever ε it printed; rows without the metric or an ε are left out.
    """
    finite = [
        r["epsilon"] for r in rows if r.get("target") != math.inf and finite_or_none(r.get("epsilon")) is not None
    ]
    inf_x = max(finite) * 10 if finite else 1.0
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        value, _ = _metric_value(r.get(metric))
        eps = inf_x if r.get("target") == math.inf else finite_or_none(r.get("epsilon"))
        if value is not None and eps is not None:
            series.setdefault(r["strategy"], []).append((eps, value))
    return {k: sorted(v) for k, v in series.items()}, inf_x


def plot_frontier(rows: list[dict], path: Path, *, metric: str = "fid_domain", title: str = "") -> Path:
    """The privacy–utility frontier: ``metric`` against ε, one line per strategy.

    ``rows`` are ``{"strategy", "target", "epsilon", "epsilon_unit", metric}`` (see
    ``frontier_series`` for the ∞ points). The legend names each strategy's ε unit (per-client,
    example-level, user-level): they are not the same guarantee.
    """
    fig, axes = _new_figure(8, 5)
    ax = axes[0, 0]
    name, label = METRIC_LABELS.get(metric, (metric, metric))
    series, inf_x = frontier_series(rows, metric)
    for strategy, pts in series.items():
        unit = next((r.get("epsilon_unit", "") for r in rows if r["strategy"] == strategy), "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{strategy} (ε: {unit})")
    ax.set_title(title or f"{name} vs ε", fontsize=11)
    if not series:
        _no_data(ax, f"no run has both ε and {metric}")
        return _save(fig, path)
    ax.set_xscale("log")
    ax.set_xlabel("ε at δ = 1e-5 (log scale; dotted line: no noise, ε = ∞)")
    ax.set_ylabel(label)
    ax.axvline(inf_x, color="0.85", linestyle=":")
    ax.legend(fontsize=8)
    return _save(fig, path)
