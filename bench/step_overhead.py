"""Flower simulation overhead per GS-WGAN step: in-process vs. Flower's simulation runtime, one run.

Both arms run the same configuration through the same round loop (``server.loop.run_experiment``);
the in-process arm calls the ClientApp directly, the other goes through ``flwr.simulation``. Time per
step is the loop's wall time (start-up excluded) divided by the steps; the steady-state figure leaves
out the steps before the first metrics line as well (Flower's Ray worker is a fresh process in every
run, so its first queries pay imports and first-call costs that a long run amortizes). The two arms
alternate (A, B, A, B ...) so that machine noise hits both. Writes ``bench/results/step_overhead.json``
and prints one line.

    python bench/step_overhead.py [--steps 60] [--repeats 2] [--model small]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.methods import ExperimentConfig  # noqa: E402
from server.reporting import RunDirectory  # noqa: E402
from simulations.experiments.simulate import _run_flower, _run_inprocess  # noqa: E402


def one_arm(arm: str, cfg: ExperimentConfig) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDirectory.create(cfg.replace(out=str(Path(tmp) / "run")))
        started = time.monotonic()
        runner = _run_inprocess if arm == "inprocess" else _run_flower
        summary, error = runner(cfg, run, False)
        if error is not None:
            raise error
        return {
            "step_s": summary["wall_s"] / summary["steps_completed"],
            "steady_step_s": steady_step_s(run.path / "metrics.jsonl"),
            "total_s": time.monotonic() - started,
            "bytes_per_step": summary["comm"]["bytes_per_step"],
        }


def steady_step_s(metrics_path: Path) -> float:
    """Wall time per step between the first and the last metrics line (cumulative ``time_s``)."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    first, last = lines[0], lines[-1]
    return (last["time_s"] - first["time_s"]) / (last["step"] - first["step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="small")
    parser.add_argument("--num-clients", type=int, default=5)
    args = parser.parse_args()
    # A fixed noise seed and sampling seed (timing only, never private) make both arms run the same
    # trajectory, so the deflated payloads have the same sizes and the byte check below compares like
    # with like. The simulated nodes must allow that: their policy says so (FEDGAN_NODE_POLICY).
    policy = Path(tempfile.mkdtemp()) / "allow-nonprivate.toml"
    policy.write_text("allow-nonprivate = true\n")
    os.environ["FEDGAN_NODE_POLICY"] = str(policy)
    cfg = ExperimentConfig(
        steps=args.steps,
        model=args.model,
        num_clients=args.num_clients,
        noise_seed=1,
        sampling_seed=1,
        progress=False,
        sample_every=10**6,
        checkpoint_every=10**6,
        eval=False,
    )
    results: dict[str, list[dict]] = {"inprocess": [], "flower": []}
    for _ in range(args.repeats):
        for arm in results:
            results[arm].append(one_arm(arm, cfg))
    med = {arm: statistics.median(r["step_s"] for r in runs) for arm, runs in results.items()}
    steady = {arm: statistics.median(r["steady_step_s"] for r in runs) for arm, runs in results.items()}
    ct = results["flower"][0]["bytes_per_step"]
    # Flower assigns random 64-bit run/node ids (varints of 9 or 10 bytes), so arms may differ by a
    # few bytes per message; report the largest relative difference rather than claim equality.
    rel_diff = max(
        abs(r["bytes_per_step"][k] - ct[k]) / ct[k] for runs in results.values() for r in runs for k in ("down", "up")
    )
    out = {
        "config": cfg.to_dict(),
        "runs": results,
        "median_step_s": med,
        "ratio_flower_over_inprocess": med["flower"] / med["inprocess"],
        "median_steady_step_s": steady,
        "steady_ratio_flower_over_inprocess": steady["flower"] / steady["inprocess"],
        "bytes_per_step": ct,
        "bytes_per_step_max_rel_diff_across_arms": rel_diff,
    }
    path = ROOT / "bench" / "results" / "step_overhead.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"step_overhead: in-process {med['inprocess'] * 1e3:.0f} ms/step, flower simulation "
        f"{med['flower'] * 1e3:.0f} ms/step, ratio {out['ratio_flower_over_inprocess']:.2f}x "
        f"(steady state {steady['inprocess'] * 1e3:.0f} vs {steady['flower'] * 1e3:.0f} ms, "
        f"{out['steady_ratio_flower_over_inprocess']:.2f}x); "
        f"CT down {ct['down']:,.0f} B up {ct['up']:,.0f} B per step (arms differ by at most {rel_diff:.1e}) "
        f"-> {path.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
