"""``fedgan audit`` at the frontier's settings: what DP-MERF's and GS-WGAN's releases really give.

DP-MERF at ledger ε 1 and 4 (the frontier's CPU configuration: K = 3,000, clip 0.32), GS-WGAN at ε 10
and 100 (K = 400, m = 1, 1,500 steps, B = 32, critic fakes = query, grad-dct 8), each calibrated with
``--target-epsilon`` as the frontier's runs are; canaries answer until their budget refuses.

    python bench/audit_frontier.py [--merf-canaries 50000] [--gswgan-canaries 4000] [--out FILE]

Writes ``bench/results/audit-frontier.json`` and prints one line per row (about 4 minutes here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.methods import ExperimentConfig, prepare  # noqa: E402
from simulations.experiments.audit import audit  # noqa: E402

MERF = dict(strategy="dp-merf", model="small", num_clients=3000, steps=400, merf_clip=0.32)
GSWGAN = dict(
    strategy="gswgan", model="small", num_clients=400, partition="iid", batch_size=32, steps=1500,
    critic_fakes="query", grad_dct=8,
)  # fmt: skip
KEPT = (
    "canaries", "ledger_releases", "epsilon_ledger", "epsilon_gaussian_exact", "mu_claimed", "mu_lower",
    "epsilon_gaussian_lower", "epsilon_one_run", "epsilon_clopper_pearson", "violated",
)  # fmt: skip


def row(name: str, settings: dict, target: float, canaries: int) -> dict:
    start = time.perf_counter()
    result = audit(prepare(ExperimentConfig(**settings, target_epsilon=target)), canaries=canaries, releases=60)
    out = {"name": name, **{k: result[k] for k in KEPT}, "wall_s": round(time.perf_counter() - start, 1)}
    print(
        f"audit_frontier: {name}: ledger ε {out['epsilon_ledger']:.3g}, audited ≥ {out['epsilon_gaussian_lower']:.3g} "
        f"(Gaussian), {out['epsilon_one_run']:.3g} (one run), {out['epsilon_clopper_pearson']:.3g} (Clopper-Pearson)",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merf-canaries", type=int, default=50_000)
    parser.add_argument("--gswgan-canaries", type=int, default=4_000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "audit-frontier.json"))
    args = parser.parse_args(argv)
    rows = [row(f"dp-merf, target ε {t:g}", MERF, t, args.merf_canaries) for t in (1.0, 4.0)]
    rows += [row(f"gswgan, target ε {t:g}", GSWGAN, t, args.gswgan_canaries) for t in (10.0, 100.0)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
