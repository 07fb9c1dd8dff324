"""The frontier's column under DPImageBench's protocol (``--protocol``): each point's run evaluated
once more by ``fedgan evaluate RUN --protocol P`` (``common/evaluation/anchors.py``), its figures
read back from eval.json. A run already evaluated under ``P`` is not evaluated again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# DPImageBench's published rows (Gong et al. 2025; Fashion-MNIST and MNIST at ε = 10): example-level,
# one trusted curator, their protocol (the figures, from their paper's tables).
PUBLISHED_PROTOCOL = [
    ("Fashion-MNIST", "DP-MERF", 0.622, 106.0),
    ("Fashion-MNIST", "DP-Kernel", 0.700, 74.0),
    ("Fashion-MNIST", "DP-GAN", 0.703, 77.0),
    ("Fashion-MNIST", "DPDM", 0.856, 17.0),
    ("Fashion-MNIST", "DP-FETA", 0.873, 13.0),
    ("MNIST", "DP-MERF", 0.813, None),
    ("MNIST", "DP-Kernel", 0.936, None),
    ("MNIST", "DP-GAN", 0.927, None),
    ("MNIST", "DPDM", 0.977, None),
]
PUBLISHED_UNIT = "10, example-level, one trusted curator (DPImageBench's protocol, on a GPU)"


def protocol_figures(out: Path, protocol: str, *, evaluate: bool) -> dict[str, Any]:
    """``protocol_acc`` (mean over its three classifiers), its std and the protocol's FID of the run in
    ``out``; evaluated now when missing and ``evaluate`` (else None figures)."""
    got = _read(out, protocol)
    if got is None and evaluate:
        cmd = [sys.executable, "-m", "simulations.cli", "evaluate", str(out), "--protocol", protocol, "--no-progress"]
        with open(out / f"protocol-{protocol}.log", "w") as log:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
        got = _read(out, protocol)
    if got is None:
        return {"protocol": protocol, "protocol_acc": None}
    return {
        "protocol": protocol,
        "protocol_acc": got["mean"],
        "protocol_acc_std": got["std"],
        "protocol_acc_noiseless_selection": got["mean_noiseless_selection"],
        "protocol_fid": got["fid"]["value"],
        "protocol_fid_samples": got["fid"]["num_samples"],
        "protocol_validation_in_training": got["validation_in_training"],
        "protocol_device": got.get("device", "cpu"),  # evaluations before the field ran on this CPU
    }


def _read(out: Path, protocol: str) -> dict[str, Any] | None:
    try:
        got = json.loads((out / "eval.json").read_text()).get("protocol")
    except (OSError, json.JSONDecodeError):
        return None
    return got if isinstance(got, dict) and got.get("protocol") == protocol else None


def protocol_cell(r: dict[str, Any]) -> str:
    """The table's cell: mean ± std (FID at N), or — when the point has none."""
    if r.get("protocol_acc") is None:
        return "—"
    fid = r.get("protocol_fid")
    fid_text = "" if fid is None else f", FID {fid:.0f} (N {r['protocol_fid_samples']:,})"
    device = r.get("protocol_device", "cpu")
    where = "" if device == "cpu" else f", classifiers on {device}"
    return f"{r['protocol_acc']:.1%} ± {r['protocol_acc_std']:.1%}{fid_text}{where}"


def published_table() -> list[str]:
    """DPImageBench's rows, in their unit."""
    lines = ["", f"DPImageBench's published rows (ε = {PUBLISHED_UNIT}):", ""]
    lines += ["| data | method | gen2real (mean of 3 classifiers) | FID |", "|---|---|---|---|"]
    for data, method, acc, fid in PUBLISHED_PROTOCOL:
        lines.append(f"| {data} | {method} | {acc:.1%} | {'—' if fid is None else f'{fid:.0f}'} |")
    return lines
