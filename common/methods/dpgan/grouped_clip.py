"""dpGAN's parameter grouping (Zhang et al. 2018): each example's gradient is clipped group by group,
with bounds that may be estimated on public data — accounted correctly.

Grouping. The parameters are split into G groups (``weight-bias``: every weight tensor in one, every
bias in the other; ``layer``: each parameter tensor its own). Example i's gradient restricted to
group j is clipped to C_j. Its whole gradient then has norm ≤ √Σ_j C_j²: that, not any one C_j, is
the sensitivity of the summed batch, and the noise must be calibrated to it. Schwabedal et al.
(papers/) found dpGAN's published code clipping per group while adding noise for one bound, which
leaves its analysis inapplicable; ``tests/unit/common/methods/dpgan/test_grouped_clip.py`` fails if the bounds are
not reflected in the noise.

Two correct noise forms, both one Gaussian mechanism with noise multiplier σ (the ledger's event is
the usual (σ, q), so ε is that of flat clipping at the same σ):

- ``isotropic``: N(0, (σ·√Σ C_j²)²) on every coordinate (Opacus' per-layer optimizer does this);
- ``proportional``: N(0, (σ·√G·C_j)²) on group j. Dividing group j by √G·C_j makes every group's
  noise σ and its sensitivity ≤ 1/√G, so the whole sensitivity is ≤ 1: the same mechanism, but a
  group with a small bound also gets small noise.

Bounds. ``equal``: C_j = C/√G, so √Σ C_j² = C (``--dpgan-clip``). ``public``: proportional to the
median per-example norm of each group's gradient on a public batch (public real rows and fakes),
rescaled so that √Σ C_j² = C again; re-estimated every ``bounds_every`` rounds. Public data costs
no privacy, and the total bound, hence the noise and ε, never changes.
"""

from __future__ import annotations

import math

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _generate_noise, _mark_as_processed
from torch import nn

from .grouping import (  # noqa: F401 - re-exported: the grouping and the optimizer are one feature
    BOUND_RULES,
    GROUPINGS,
    NOISE_FORMS,
    equal_bounds,
    group_norms,
    parameter_groups,
    scaled_bounds,
)


class GroupedDPOptimizer(DPOptimizer):
    """Opacus' DPOptimizer with per-group clipping and one of the two correct noise forms."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        groups: list[list[nn.Parameter]],
        bounds: list[float],
        noise: str = "isotropic",
        noise_multiplier: float,
        expected_batch_size: int,
        loss_reduction: str = "mean",
        generator: torch.Generator | None = None,
    ) -> None:
        if noise not in NOISE_FORMS:
            raise ValueError(f"unknown noise form {noise!r}; choose one of {', '.join(NOISE_FORMS)}")
        self.groups, self.noise_form = groups, noise
        self.bounds = list(bounds)
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=self.total_bound,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=generator,
        )
        self.set_bounds(bounds)

    @property
    def total_bound(self) -> float:
        """√Σ C_j²: the per-example sensitivity of the summed gradient."""
        return math.sqrt(sum(b * b for b in self.bounds))

    def set_bounds(self, bounds: list[float]) -> None:
        if len(bounds) != len(self.groups) or any(not b > 0 for b in bounds):
            raise ValueError(f"need {len(self.groups)} positive bounds, got {bounds}")
        self.bounds = list(bounds)
        self.max_grad_norm = self.total_bound
        self._std = {
            p: self.noise_multiplier
            * (self.total_bound if self.noise_form == "isotropic" else math.sqrt(len(self.groups)) * bound)
            for group, bound in zip(self.groups, self.bounds, strict=True)
            for p in group
        }

    def noise_std(self, p: nn.Parameter) -> float:
        """The std of the noise added to parameter ``p``'s summed gradient."""
        return self._std[p]

    def clip_and_accumulate(self) -> None:
        rows = {p: self._get_flat_grad_sample(p).to(p.dtype) for p in self.params}
        n = next(iter(rows.values())).shape[0]
        for j, group in enumerate(self.groups):
            if n:
                norms = group_norms([group], rows)[:, 0]
                factor = (self.bounds[j] / (norms + 1e-6)).clamp(max=1.0)
            else:
                factor = torch.zeros(0, device=rows[group[0]].device)
            for p in group:
                _check_processed_flag(p.grad_sample)
                grad = torch.einsum("i,i...", factor.to(rows[p].dtype), rows[p])
                p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
                _mark_as_processed(p.grad_sample)

    def add_noise(self) -> None:
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = _generate_noise(
                std=self._std[p], reference=p.summed_grad, generator=self.generator, secure_mode=self.secure_mode
            )
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)
