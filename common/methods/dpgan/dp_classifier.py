"""DPAC's auxiliary classifier on DPGAN's curator, trained with DP-SGD on real data (charged like D's
steps, at the same σ and q) and freely on generated data (post-processing)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.learning.dpac import run_mode

from .dpsgd import _check_trainer_args, _wrap, frozen_module, hooks_disabled

if TYPE_CHECKING:
    from opacus.optimizers import DPOptimizer


class DpClassifierTrainer:
    """DPAC's classifier C on the curator: DP-SGD on real data (Poisson batch, per-example clipping,
    σC noise, normaliser B), free steps on generated data (post-processing of released networks).

    Same σ, q and noise generator as the discriminator's steps, so each DP step is one more (σ, q)
    event of the curator's ledger (``steps_taken`` counts them, from the optimizer's own hook, only
    when noise was added). ``joint`` mixes B fakes into the DP batch as rows of their own (clipped
    like the fake rows of D's step, normaliser 2B): the real rows' sensitivity is unchanged.
    """

    def __init__(
        self,
        C: nn.Module,
        *,
        lr: float,
        noise_multiplier: float,
        max_grad_norm: float,
        sample_rate: float,
        expected_batch_size: int,
        joint: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        _check_trainer_args("ns", "hooks", noise_multiplier, max_grad_norm, sample_rate)
        self.C = C
        self.module = _wrap(C, "hooks")
        from opacus.optimizers import DPOptimizer

        self.optimizer = DPOptimizer(
            torch.optim.Adam(C.parameters(), lr=lr),
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=(2 if joint else 1) * expected_batch_size,
            loss_reduction="mean",
            generator=generator,
        )
        self.steps_taken = 0
        self.optimizer.attach_step_hook(self._count_step)

    def _count_step(self, _optimizer: DPOptimizer) -> None:
        self.steps_taken += 1

    def dp_step(self, x: Tensor, y: Tensor) -> None:
        """One DP-SGD step on the rows (x, y): real rows, plus fakes in ``joint`` mode."""
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.module(x), y.long(), reduction="sum").backward()
        self.optimizer.step()

    def free_step(self, fake: Tensor, fake_y: Tensor) -> None:
        """A plain Adam step on generated data: nothing of the real data enters it, so no noise and
        no charge; Opacus' hooks are off so that no per-sample rows linger for the next DP step."""
        self.optimizer.original_optimizer.zero_grad(set_to_none=True)
        with hooks_disabled(self.module):
            F.cross_entropy(self.C(fake.detach()), fake_y.long()).backward()
        self.optimizer.original_optimizer.step()
        self.optimizer.original_optimizer.zero_grad(set_to_none=True)

    def train(self, mode: str, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor) -> None:
        """C's share of one round, as DPAC's ``mode`` says (``common/dpac.run_mode``)."""
        run_mode(
            mode,
            real=lambda: self.dp_step(real, real_y),
            fake=lambda: self.free_step(fake, fake_y),
            joint=lambda: self.dp_step(torch.cat([real, fake.detach()]), torch.cat([real_y, fake_y])),
        )

    @contextmanager
    def frozen(self) -> Iterator[nn.Module]:
        """C for the generator step: parameters frozen and Opacus' hooks off (see the D trainer's)."""
        with frozen_module(self.C, self.module):
            yield self.C
