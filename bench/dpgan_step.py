"""Cost of one DP-SGD discriminator step (Opacus) against the same step without privacy.

Both arms use the DPGAN discriminator of one preset (``build_dpgan_discriminator``: spectral norm
off, as Opacus needs), the non-saturating loss on B real + B fake rows and Adam. The private arm
is ``DpDiscriminatorTrainer.step`` (per-row gradients, clipping, noise) in each of Opacus'
grad-sample modes; a mode that fails is reported with its error. The real batch is fixed at B (not
Poisson) so both arms process the same rows; fakes are drawn once (the generator's cost is the same
in both arms and not measured). Arms alternate within each repetition so machine noise hits all.
Writes ``bench/results/dpgan_step.json`` and prints one line.

    python bench/dpgan_step.py [--batch 64] [--model small] [--steps 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.methods.dpgan.dpsgd import (  # noqa: E402
    GRAD_SAMPLE_MODES,
    DpDiscriminatorTrainer,
    build_dpgan_discriminator,
    ns_row_losses,
)

warnings.filterwarnings("ignore")


def non_private_step(model: str, batch: int) -> Callable[..., None]:
    """Plain Adam step on the same loss, averaged over the 2B rows."""
    D = build_dpgan_discriminator(model)
    opt = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(real, real_y, fake, fake_y) -> None:
        opt.zero_grad(set_to_none=True)
        scores = D(torch.cat([real, fake]), torch.cat([real_y, fake_y]))
        is_real = torch.arange(scores.shape[0]) < real.shape[0]
        (ns_row_losses(scores, is_real).sum() / (2 * batch)).backward()
        opt.step()

    return step


def private_step(model: str, batch: int, mode: str) -> Callable[..., None]:
    trainer = DpDiscriminatorTrainer(
        build_dpgan_discriminator(model),
        lr=2e-4,
        betas=(0.5, 0.999),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sample_rate=batch / 60000,
        expected_batch_size=batch,
        grad_sample_mode=mode,
        generator=torch.Generator().manual_seed(0),
    )
    return lambda *batch_: trainer.step(*batch_)


def time_steps(step: Callable[..., None], data: tuple, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step(*data)
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    b = args.batch
    data = (torch.rand(b, 1, 28, 28), torch.randint(0, 10, (b,)), torch.rand(b, 1, 28, 28), torch.randint(0, 10, (b,)))
    arms: dict[str, Callable[..., None]] = {"non_private": non_private_step(args.model, b)}
    errors: dict[str, str] = {}
    for mode in GRAD_SAMPLE_MODES:
        try:
            arm = private_step(args.model, b, mode)
            time_steps(arm, data, 1)  # warm-up, and fail here rather than mid-run
            arms[f"dp_{mode}"] = arm
        except Exception as error:  # a mode Opacus cannot run on this model is reported, not fatal
            errors[f"dp_{mode}"] = f"{type(error).__name__}: {error}"[:300]
    time_steps(arms["non_private"], data, 1)
    runs: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, arm in arms.items():
            runs[name].append(time_steps(arm, data, args.steps))
    med = {name: statistics.median(r) for name, r in runs.items()}
    best = min((n for n in med if n != "non_private"), key=med.__getitem__)
    ratio = med[best] / med["non_private"]
    out = {
        "config": vars(args) | {"threads": 2, "real_rows": b, "fake_rows": b},
        "step_s": runs,
        "median_step_s": med,
        "errors": errors,
        "fastest_private_mode": best.removeprefix("dp_"),
        "ratio_private_over_non_private": ratio,
    }
    path = ROOT / "bench" / "results" / "dpgan_step.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    modes = ", ".join(f"{n.removeprefix('dp_')} {med[n] * 1e3:.0f} ms" for n in med if n != "non_private")
    print(
        f"dpgan_step ({args.model}, B={b}): non-private {med['non_private'] * 1e3:.0f} ms/step, "
        f"DP-SGD {med[best] * 1e3:.0f} ms/step ({best.removeprefix('dp_')}), ratio {ratio:.2f}x "
        f"[modes: {modes}; failed: {', '.join(errors) or 'none'}] -> {path.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
