"""The frontier's table (``frontier.py`` writes it beside its JSON): one row per point, the levers,
the source papers' further methods beside their strategy's main row, and the published figures."""

from __future__ import annotations

from typing import Any

from frontier_protocol import protocol_cell, published_table

PUBLISHED = [  # figures from the papers, with their units: none of them is a per-client guarantee
    {
        "source": "GS-WGAN re-run under one protocol (issue 12's reference)",
        "dataset": "Fashion-MNIST",
        "method": "DP-GAN",
        "epsilon": "10, example-level, centralized",
        "fid": 76.9,
        "gen2real": 0.703,
    },
    {
        "source": "GS-WGAN re-run under one protocol (issue 12's reference)",
        "dataset": "Fashion-MNIST",
        "method": "GS-WGAN",
        "epsilon": "10, example-level, centralized",
        "fid": 97.2,
        "gen2real": 0.567,
    },
    {
        "source": "DP-GAN revisited",
        "dataset": "MNIST",
        "method": "DP-GAN",
        "epsilon": "10, example-level, centralized",
        "fid": 13.0,
        "gen2real": 0.950,
    },
]


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    lines = [
        f"Command: `{command}`",
        "",
        "| strategy | ε unit | target ε | ε spent (recomputed) | σ | FID (N) | domain FID | IS "
        "| gen2real CNN / MLP | real2gen CNN | gen2real, protocol | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [r for r in rows if r.get("lever") is None and r.get("variant") is None]:
        if "error" in r:
            lines.append(f"| {r['strategy']} | | {r['target']:g} | failed: {r['error']} | | | | | | | | |")
            continue
        eps = "∞ (no noise)" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        fid = _fid_cell(r)
        lines.append(
            f"| {r['strategy']} | {r['epsilon_unit']} | {r['target']:g} | {eps} | {r['noise_multiplier']:.3g} | {fid} "
            f"| {f(r['fid_domain'], '.1f')} | {f(r['inception_score'], '.2f')} "
            f"| {r['gen2real_cnn']:.1%} / {r['gen2real_mlp']:.1%} | {r['real2gen_cnn']:.1%} | {protocol_cell(r)} "
            f"| {f(r['wall_s'], '.0f')} |"
        )
    levers = [r for r in rows if r.get("lever") is not None]
    if levers:
        lines += [
            "",
            f"GS-WGAN's free levers at target ε = {levers[0]['target']:g} (cumulative: each row adds one):",
            "",
            "| lever | ε spent | σ | FID (N) | domain FID | gen2real CNN / MLP | wall s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in levers:
            if "error" in r:
                lines.append(f"| {r['lever']} | {r['error']} | | | | | |")
                continue
            fid = _fid_cell(r)
            lines.append(
                f"| {r['lever']} | {f(r['epsilon'], '.3g')} | {r['noise_multiplier']:.3g} | {fid} "
                f"| {f(r['fid_domain'], '.1f')} | {r['gen2real_cnn']:.1%} / {r['gen2real_mlp']:.1%} "
                f"| {f(r['wall_s'], '.0f')} |"
            )
    lines += variant_table(rows)
    lines += ["", "Published (not comparable as guarantees: example-level, one trusted curator):", ""]
    lines += ["| source | data | method | ε | FID | gen2real |", "|---|---|---|---|---|---|"]
    for p in PUBLISHED:
        lines.append(
            f"| {p['source']} | {p['dataset']} | {p['method']} | {p['epsilon']} | {p['fid']} | {p['gen2real']:.1%} |"
        )
    if any(r.get("protocol_acc") is not None for r in rows):
        lines += published_table()
    return "\n".join(lines) + "\n"


def variant_table(rows: list[dict[str, Any]]) -> list[str]:
    """The source papers' methods and options, each beside its strategy's main row (the baseline)."""
    variants = [r for r in rows if r.get("variant") is not None]
    if not variants:
        return []
    target = variants[0]["target"]
    lines = [
        "",
        f"The source papers' further methods at target ε = {target:g} (each on top of its strategy's main row, "
        "the baseline; DPAC's ablation follows Chen et al. 2023, Table 4):",
        "",
        "| strategy | row | ε spent | σ | FID (N) | domain FID | IS | gen2real CNN / MLP "
        "| real2gen CNN / MLP | gen2real, protocol | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy in dict.fromkeys(r["strategy"] for r in variants):
        base = [
            {**r, "variant": "baseline"}
            for r in rows
            if r["strategy"] == strategy and r["target"] == target and r.get("lever") is None and "variant" not in r
        ]
        for r in base + [r for r in variants if r["strategy"] == strategy]:
            if "error" in r:
                lines.append(f"| {strategy} | {r['variant']} | {r['error']} | | | | | | | | |")
                continue
            fid = _fid_cell(r)
            lines.append(
                f"| {strategy} | {r['variant']} | {_f(r['epsilon'], '.3g')} | {r['noise_multiplier']:.3g} | {fid} "
                f"| {_f(r['fid_domain'], '.1f')} | {_f(r['inception_score'], '.2f')} "
                f"| {r['gen2real_cnn']:.1%} / {r['gen2real_mlp']:.1%} "
                f"| {r['real2gen_cnn']:.1%} / {_f(r.get('real2gen_mlp'), '.1%')} | {protocol_cell(r)} "
                f"| {_f(r['wall_s'], '.0f')} |"
            )
    return lines


def _f(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def _fid_cell(r: dict[str, Any]) -> str:
    """The Inception FID with its sample count N (the two only mean something together)."""
    return "—" if r["fid"] is None else f"{r['fid']:.1f} ({r['fid_samples']})"
