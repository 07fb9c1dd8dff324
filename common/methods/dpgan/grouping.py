"""The parameter groups of dpGAN's grouped clipping and their bounds: plain torch, no Opacus.

Split from ``grouped_clip`` (whose optimizer subclasses Opacus' ``DPOptimizer``) so that validating
a configuration — every process does, a Flower ClientApp included — does not import Opacus. What the
groups and bounds mean, and why the noise must follow them, is in ``grouped_clip``'s docstring.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

GROUPINGS = ("none", "weight-bias", "layer")
BOUND_RULES = ("equal", "public")
NOISE_FORMS = ("isotropic", "proportional")


def parameter_groups(module: nn.Module, grouping: str) -> list[list[nn.Parameter]]:
    """The trainable parameters of ``module`` in groups (``GROUPINGS``), each group non-empty."""
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if grouping == "none":
        return [[p for _, p in named]]
    if grouping == "layer":
        return [[p] for _, p in named]
    if grouping == "weight-bias":
        groups = [
            [p for name, p in named if not name.endswith("bias")],
            [p for name, p in named if name.endswith("bias")],
        ]
        return [g for g in groups if g]
    raise ValueError(f"unknown parameter grouping {grouping!r}; choose one of {', '.join(GROUPINGS)}")


def equal_bounds(total: float, groups: int) -> list[float]:
    """C_j = C/√G: the whole per-example norm stays ≤ C."""
    return [total / math.sqrt(groups)] * groups


def scaled_bounds(raw: list[float], total: float) -> list[float]:
    """``raw`` rescaled so that √Σ C_j² = ``total`` (a zero estimate gets a tiny positive bound)."""
    floor = [max(r, 1e-12) for r in raw]
    norm = math.sqrt(sum(r * r for r in floor))
    return [total * r / norm for r in floor]


def group_norms(groups: list[list[nn.Parameter]], rows: dict[nn.Parameter, Tensor]) -> Tensor:
    """Per-example norms ``[n, G]`` of each group's gradient rows (``rows[p]``: ``[n, *p.shape]``)."""
    per_group = []
    for group in groups:
        norms = torch.stack([rows[p].reshape(rows[p].shape[0], -1).norm(2, dim=1) for p in group], dim=1)
        per_group.append(norms.norm(2, dim=1))
    return torch.stack(per_group, dim=1)
