"""What the measured frontier shows at an ε, per method: the sentence a run's summary prints next to
its ε instead of a general word on what papers target. Each point is pinned here from a committed
frontier result (``bench/results/frontier-*.json``, every ε recomputed there from the run's
privacy.json) and cross-checked against that file by ``tests/unit/common/evaluation/test_measured.py``,
so the sentence cannot drift from the measurement it cites.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """One frontier point: a run of ``method`` at ``epsilon`` in its own unit, on Fashion-MNIST."""

    epsilon: float
    gen2real: float  # the quick CNN classifier trained on 2,000 generated images, tested on real ones
    source: str  # the frontier result, under bench/results/ (.json holds the point, .md its command)


SEEDED = "{method} seeded by {seed}"  # a seeded run's key, e.g. "gswgan seeded by dp-merf"

MEASURED: dict[str, tuple[Measured, ...]] = {
    "gswgan": (
        Measured(1.0, 0.0455, "frontier-secure-gswgan-fashion-mnist-cpu"),
        Measured(10.0, 0.3075, "frontier-secure-gswgan-fashion-mnist-cpu"),
    ),
    "gswgan seeded by dp-merf": (
        Measured(1.0, 0.6120, "frontier-seeded-e1-fashion-mnist-cpu"),
        Measured(10.0, 0.7280, "frontier-seeded-fashion-mnist-cpu"),
    ),
    "dpgan": (
        Measured(1.0, 0.5410, "frontier-fashion-mnist-cpu"),
        Measured(10.0, 0.6660, "frontier-fashion-mnist-cpu"),
    ),
    "fedavg-gan": (
        Measured(1.0, 0.0955, "frontier-secure-fedavg-gan-fashion-mnist-cpu"),
        Measured(10.0, 0.1050, "frontier-secure-fedavg-gan-fashion-mnist-cpu"),
    ),
    "fedavg-gan seeded by dp-merf": (Measured(10.0, 0.7165, "frontier-seeded-fedavg-gan-fashion-mnist-cpu"),),
    "dp-merf": (
        Measured(1.0, 0.6495, "frontier-secure-dp-merf-fashion-mnist-cpu"),
        Measured(10.0, 0.6820, "frontier-secure-dp-merf-fashion-mnist-cpu"),
    ),
    "dp-ntk": (
        Measured(1.0, 0.1652, "frontier-protocol-fashion-mnist-cpu"),
        Measured(10.0, 0.4245, "frontier-protocol-fashion-mnist-cpu"),
    ),
}


def nearest(method: str, epsilon: float) -> Measured | None:
    """The measured point of ``method`` whose ε is nearest ``epsilon`` on a log scale (ε is a
    multiplicative quantity: ε 2 reads the ε 1 point, ε 5 the ε 10 one)."""
    points = MEASURED.get(method, ())
    if not points or not (epsilon > 0 and math.isfinite(epsilon)):
        return None
    return min(points, key=lambda p: abs(math.log(p.epsilon / epsilon)))


def measured_sentence(method: str, epsilon: float | None) -> str:
    """What the frontier measured for ``method`` near ``epsilon``, or where to look when it has not."""
    point = nearest(method, epsilon) if epsilon is not None else None
    if point is None:
        return "the frontier (docs/frontier.md) shows what quality each ε bought (bench/results/frontier-*.md)"
    return (
        f"measured here: {method} at ε {point.epsilon:g} reached {point.gen2real:.1%} gen2real on Fashion-MNIST "
        f"(chance 10%; bench/results/{point.source}.md, which holds its command and the other ε)"
    )
