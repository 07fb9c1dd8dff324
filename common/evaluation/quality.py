"""Warnings on a released generator's figures, printed under the evaluation table and shown in the
report: a generator whose samples a classifier cannot tell apart from chance, or whose FID is far from
any data, is no release worth its ε, and the run should say so rather than leave it to the reader.
"""

from __future__ import annotations

from typing import Any

CHANCE_MARGIN = 0.05  # gen2real within 5 points of 1/classes: the samples carry no class structure
# Above this the samples are far from the data: on Fashion-MNIST the frontier's generators at chance
# read FID 500 to 555, the seeded `make run` reads 214 and DP-MERF at ε 10 (protocol) 124.
FID_BOUND = 300.0


def quality_warnings(eval_result: dict[str, Any], *, num_classes: int | None) -> list[str]:
    """One line per figure that says the generator learned little; none for a figure that is absent."""
    warnings = []
    best = _best_gen2real(eval_result.get("gen2real_acc"))
    if best is not None and num_classes:
        chance = 1.0 / num_classes
        if best <= chance + CHANCE_MARGIN:
            warnings.append(
                f"warning: gen2real {best:.1%} is within {CHANCE_MARGIN * 100:.0f} points of chance ({chance:.0%} for "
                f"{num_classes} classes): the samples carry no class structure a classifier can learn"
            )
    fid = _value(eval_result.get("fid"))
    if fid is not None and fid > FID_BOUND:
        warnings.append(
            f"warning: FID {fid:.0f} is above {FID_BOUND:.0f}: the samples are far from the data (generators at "
            "chance read 500 and more on Fashion-MNIST)"
        )
    return warnings


def classifier_scores(entry: dict[str, Any]) -> dict[str, float | None]:
    """An accuracy entry's figure per classifier (eval.json's ``{"cnn": .., "mlp": ..}``), without its
    provenance (``data``, ``publishable``) or sample counts: what the table prints and the warning reads."""
    return {k: v for k, v in entry.items() if (v is None or type(v) in (int, float)) and not k.startswith("num_")}


def _best_gen2real(entry: Any) -> float | None:
    """The best classifier's accuracy."""
    if isinstance(entry, dict):
        scores = [v for v in classifier_scores(entry).values() if v is not None]
        return max(scores) if scores else None
    return float(entry) if type(entry) in (int, float) else None


def _value(entry: Any) -> float | None:
    value = entry.get("value") if isinstance(entry, dict) else entry
    return float(value) if type(value) in (int, float) else None
