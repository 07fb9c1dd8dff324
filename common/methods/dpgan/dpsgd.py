"""DP-SGD for a GAN's discriminator: a DP step (Bie, Kamath, Zhang 2023, Algorithm 1) and per-row
WGAN-GP gradients. DPGAN's curator (``curator.py``) runs it; DPAC's classifier has its own
trainer (``dp_classifier.py``), the adaptive n_D its schedule (``adaptive.py``).

One discriminator step (``DpDiscriminatorTrainer.step``):

1. a real batch drawn by Poisson sampling with rate q = B/N (``Sampler.poisson``: secret), so the
   subsampled-Gaussian accountants apply and the batch size itself is random (possibly 0);
2. B generated samples, which depend on the data only through earlier *released* D's;
3. ONE forward pass over ``cat([real, fake])``: every real and every fake example is its own row of
   ``p.grad_sample`` and is clipped to C separately, exactly as Algorithm 1 line 6 writes it;
4. Opacus' ``DPOptimizer`` sums the clipped rows, adds N(0, (σC)^2), divides by the fixed
   normaliser 2B (line 7: B real + B fake rows expected) and takes the Adam step.

Why one forward pass: Opacus' hooks, given two forward passes (real, then fake, as in its DCGAN
example) and one backward, *add* fake row i into real row i and clip the pair jointly
(``create_or_accumulate_grad_sample``; pinned in tests/unit/common/methods/dpgan/test_dpsgd.py). Pairing is
positional, so removing one real example re-pairs all later ones with different fakes; that is
not Algorithm 1 and its sensitivity argument is less direct. With separate rows, the fake rows'
clipped sum is a function of G only, so adding or removing one real example changes the noised sum
by at most C: fakes cost no privacy, and each step is one subsampled Gaussian (σ, q), which is all
the accountant records. Generator steps and evaluations of D on fakes are post-processing.

Discriminator: Opacus has no per-sample gradients for spectral-norm parametrizations (its
``GradSampleModule`` rejects them: "trainable layer with buffers"), and the paper's D has none, so
:func:`build_dpgan_discriminator` is the project's projection D with spectral norm switched off.

``loss="wgan-gp"``: Opacus' grad samplers cannot differentiate a gradient penalty, so per-example
gradients of the whole critic loss (penalty included, a nested input gradient) are computed with
``torch.func`` (``vmap(grad(...))`` over ``functional_call``), written to ``p.grad_sample``, and the
same ``DPOptimizer`` clips, noises and normalises them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from common.learning.models import PRESET_SPECS, DiscriminatorSpec, ProjectionDiscriminator
from common.privacy.analysis import Event

if TYPE_CHECKING:
    from opacus.optimizers import DPOptimizer

# Opacus (and grouped_clip.py, which subclasses its optimizer) is imported where a trainer is built, not
# here: every method's Options are composed into the config, so this module is imported by every
# process, a Flower ClientApp included (one per message in a deployment), and the ``opacus``
# package import alone took 2.4 s of its start-up on this project's CPU.

# Opacus registers full backward hooks; our inputs (data, fakes) never require gradients, so torch
# warns at every DP step that the hook fires on module outputs only: that is exactly the case the
# per-sample rows are built for, so this one message is silenced.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect")

DpganLoss = Literal["ns", "wgan-gp"]
GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew")


# --- sampling and model ------------------------------------------------------------------------


def build_dpgan_discriminator(preset: str, *, num_classes: int = 10) -> ProjectionDiscriminator:
    """The projection discriminator of ``preset`` WITHOUT spectral norm (Opacus cannot compute
    per-sample gradients through spectral-norm parametrizations; Bie et al.'s D has none)."""
    if preset not in PRESET_SPECS:
        raise ValueError(f"unknown model preset {preset!r}")
    spec = PRESET_SPECS[preset][1]
    return ProjectionDiscriminator(DiscriminatorSpec(spec.channels, spectral_norm=False), num_classes=num_classes)


# --- per-row losses ----------------------------------------------------------------------------


def ns_row_losses(scores: Tensor, is_real: Tensor) -> Tensor:
    """Non-saturating per-row loss on logits: ``-log σ(s)`` for real rows, ``-log(1-σ(s))`` for
    fake rows (Algorithm 1 line 6), written with softplus for numerical stability."""
    return torch.where(is_real, F.softplus(-scores), F.softplus(scores))


def _wgan_real_row_loss(
    score_fn: Callable[[dict, Tensor, Tensor], Tensor],
    *,
    gp_weight: float,
    drift: float,
) -> Callable[..., Tensor]:
    """Per-example WGAN-GP loss of one real row: ``-D(x) + drift·D(x)^2 + λ(‖∇D(x̂)‖-1)^2``.

    The penalty belongs to the real row because its interpolate x̂ touches that real example; the
    fake it is paired with is data-independent, so the row is still one example's contribution.
    """

    def loss(params: dict, x: Tensor, y: Tensor, x_pair: Tensor, alpha: Tensor) -> Tensor:
        s = score_fn(params, x, y)
        x_hat = alpha * x + (1 - alpha) * x_pair
        g = grad(lambda xx: score_fn(params, xx, y))(x_hat)
        gp = (torch.sqrt(g.pow(2).sum() + 1e-12) - 1).pow(2)
        return -s + drift * s.pow(2) + gp_weight * gp

    return loss


def interpolation_partners(n_real: int, n_fake: int, generator: torch.Generator | None) -> Tensor:
    """For each real row, the index of the fake it is interpolated with, drawn independently and
    uniformly. Pairing by position (row i with fake i) would make one example's removal shift every
    later row onto another partner, so a row's loss would depend on the other examples; with
    independent draws each row's (partner, alpha) is its own randomness, independent of the data."""
    if n_fake < 1 and n_real > 0:
        raise ValueError("real rows need at least one fake to be interpolated with")
    device = generator.device if generator is not None else None
    return torch.randint(max(n_fake, 1), (n_real,), generator=generator, device=device)


def wgan_gp_sample_grads(
    D: nn.Module,
    real: Tensor,
    real_y: Tensor,
    fake: Tensor,
    fake_y: Tensor,
    alpha: Tensor,
    partners: Tensor,
    *,
    gp_weight: float = 10.0,
    drift: float = 0.0,
) -> dict[str, Tensor]:
    """Per-row gradients ``[n_real + n_fake, *p.shape]`` of the WGAN-GP critic loss, by name.

    Real row i is interpolated with fake ``partners[i]`` (see :func:`interpolation_partners`) at
    ``alpha[i]`` ~ U[0,1]; fake row j's loss is ``D(fake_j)``. Opacus' hooks cannot do this (nested
    input gradient), so each row is differentiated separately with torch.func.
    """
    params = {k: v.detach() for k, v in D.named_parameters()}
    buffers = dict(D.named_buffers())

    def score(p: dict, x: Tensor, y: Tensor) -> Tensor:
        return functional_call(D, (p, buffers), (x.unsqueeze(0), y.unsqueeze(0))).squeeze(0)

    rows = []
    if real.shape[0] > 0:
        real_loss = _wgan_real_row_loss(score, gp_weight=gp_weight, drift=drift)
        pair = fake.detach()[partners]
        a = alpha.reshape(-1, *([1] * (real.dim() - 1)))
        rows.append(vmap(grad(real_loss), in_dims=(None, 0, 0, 0, 0))(params, real, real_y, pair, a))
    if fake.shape[0] > 0:
        rows.append(vmap(grad(score), in_dims=(None, 0, 0))(params, fake.detach(), fake_y))
    return {k: torch.cat([r[k] for r in rows]) for k in params}


# --- the DP discriminator step -----------------------------------------------------------------


class DpDiscriminatorTrainer:
    """DP-SGD on D: Poisson real batch + B fakes, per-row clipping, σC noise, Adam (Opacus).

    ``expected_batch_size`` is B, the expected REAL batch (q·N); the optimizer divides the noised
    sum by 2B, the expected number of rows (Algorithm 1 line 7). A data-independent normaliser is
    required: dividing by the realised batch size would leak it. Each call of :meth:`step` that adds
    noise counts as one (σ, q) event; nothing else is ever charged.
    """

    def __init__(
        self,
        D: nn.Module,
        *,
        lr: float,
        betas: tuple[float, float] = (0.5, 0.999),
        noise_multiplier: float,
        max_grad_norm: float,
        sample_rate: float,
        expected_batch_size: int,
        loss: DpganLoss = "ns",
        gp_weight: float = 10.0,
        drift: float = 0.0,
        grad_sample_mode: str = "hooks",
        generator: torch.Generator | None = None,
        grouping: str = "none",
        noise_form: str = "isotropic",
    ) -> None:
        """``grouping`` other than "none" clips per parameter group (``grouped_clip.py``), with
        equal bounds C/√G to start (``set_public_bounds`` re-estimates them) and ``noise_form``."""
        _check_trainer_args(loss, grad_sample_mode, noise_multiplier, max_grad_norm, sample_rate)
        self.D = D
        self.loss = loss
        self.gp_weight, self.drift = gp_weight, drift
        self.noise_multiplier, self.sample_rate = float(noise_multiplier), float(sample_rate)
        self.generator = generator
        # The penalty needs torch.func per-row gradients; NS uses Opacus' own grad samplers.
        self.module = D if loss == "wgan-gp" else _wrap(D, grad_sample_mode)
        adam = torch.optim.Adam(D.parameters(), lr=lr, betas=betas)
        self.grouping = grouping
        from opacus.optimizers import DPOptimizer

        from .grouped_clip import GroupedDPOptimizer, equal_bounds, parameter_groups

        if grouping == "none":
            self.optimizer = DPOptimizer(
                adam,
                noise_multiplier=noise_multiplier,
                max_grad_norm=max_grad_norm,
                expected_batch_size=2 * expected_batch_size,
                loss_reduction="mean",
                generator=generator,
            )
        else:
            groups = parameter_groups(D, grouping)
            self.optimizer = GroupedDPOptimizer(
                adam,
                groups=groups,
                bounds=equal_bounds(max_grad_norm, len(groups)),
                noise=noise_form,
                noise_multiplier=noise_multiplier,
                expected_batch_size=2 * expected_batch_size,
                generator=generator,
            )
        self.total_bound = float(max_grad_norm)
        self.steps_taken = 0
        # Counted by the optimizer's own hook, which runs only after noise was added.
        self.optimizer.attach_step_hook(self._count_step)

    def _count_step(self, _optimizer: DPOptimizer) -> None:
        self.steps_taken += 1

    def step(self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor) -> dict[str, float]:
        """One DP step on D. Stats are computed on FAKE rows only (D on fakes is post-processing;
        anything about the real batch, even its size, would be an unaccounted release)."""
        self.optimizer.zero_grad(set_to_none=True)
        fake = fake.detach()
        if self.loss == "ns":
            fake_scores = self._ns_backward(real, real_y, fake, fake_y)
        else:
            fake_scores = self._wgan_gp_grad_samples(real, real_y, fake, fake_y)
        self.optimizer.step()
        return {
            "d_fake": float(fake_scores.mean()) if len(fake_scores) else math.nan,
            "fake_accuracy": fake_accuracy(fake_scores),
        }

    def _ns_backward(self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor) -> Tensor:
        """One forward over real+fake so each example is its own grad_sample row (see module doc)."""
        scores = self.module(torch.cat([real, fake]), torch.cat([real_y, fake_y]))
        is_real = torch.arange(scores.shape[0], device=scores.device) < real.shape[0]
        # Summed loss, so grad_sample rows are plain per-row gradients; the optimizer divides
        # the noised sum by the fixed 2B ("mean" with expected_batch_size there).
        ns_row_losses(scores, is_real).sum().backward()
        return scores.detach()[real.shape[0] :]

    def _wgan_gp_grad_samples(self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor) -> Tensor:
        device = self.generator.device if self.generator is not None else real.device
        alpha = torch.rand(real.shape[0], generator=self.generator, device=device).to(real.device)
        partners = interpolation_partners(real.shape[0], fake.shape[0], self.generator).to(real.device)
        grads = wgan_gp_sample_grads(
            self.D, real, real_y, fake, fake_y, alpha, partners, gp_weight=self.gp_weight, drift=self.drift
        )
        for name, p in self.D.named_parameters():
            p.grad_sample = grads[name]
        with torch.no_grad():
            return self.D(fake, fake_y)

    @property
    def group_bounds(self) -> list[float] | None:
        """The per-group clipping bounds (None without a grouping): kept with the curator's state."""
        return None if self.grouping == "none" else list(self.optimizer.bounds)

    def set_public_bounds(self, real: Tensor, real_y: Tensor, fake: Tensor, fake_y: Tensor) -> list[float]:
        """Group bounds from PUBLIC rows (public real examples and fakes): proportional to each group's
        median per-row gradient norm, rescaled to the total bound C, so noise and ε stay as they were.
        Nothing private enters: the rows are computed and discarded, no step is taken or charged."""
        from .grouped_clip import GroupedDPOptimizer, group_norms, scaled_bounds

        if not isinstance(self.optimizer, GroupedDPOptimizer):
            raise ValueError("public clipping bounds need a parameter grouping")
        self.optimizer.zero_grad(set_to_none=True)
        fake = fake.detach()
        if self.loss == "ns":
            self._ns_backward(real, real_y, fake, fake_y)
        else:
            self._wgan_gp_grad_samples(real, real_y, fake, fake_y)
        rows = {p: p.grad_sample for p in self.D.parameters()}
        medians = group_norms(self.optimizer.groups, rows).median(dim=0).values.tolist()
        self.optimizer.zero_grad(set_to_none=True)
        bounds = scaled_bounds(medians, self.total_bound)
        self.optimizer.set_bounds(bounds)
        return bounds

    @contextmanager
    def hooks_off(self) -> Iterator[nn.Module]:
        """D with Opacus' hooks off, for non-private training on public data (no per-sample rows)."""
        with hooks_disabled(self.module):
            yield self.D

    @contextmanager
    def frozen(self) -> Iterator[nn.Module]:
        """D for the generator step: parameters frozen and Opacus' hooks off.

        The hooks sit on D's own submodules, so a generator step through D would otherwise store
        activations and per-sample gradients that the next DP step would mix into its batch.
        """
        with frozen_module(self.D, self.module):
            yield self.D

    def privacy_events(self) -> list[Event]:
        """``[(noise_multiplier, sample_rate, steps_taken)]``: what actually ran, for the ledger."""
        if self.steps_taken == 0:
            return []
        return [(self.noise_multiplier, self.sample_rate, self.steps_taken)]


@contextmanager
def hooks_disabled(module: nn.Module) -> Iterator[None]:
    """Opacus' grad-sample hooks off on ``module`` (a no-op for a module without them), so a pass
    through it stores no activations or per-sample rows for the next DP step to mix in."""
    hooks = getattr(module, "disable_hooks", None) is not None
    if hooks:
        module.disable_hooks()
    try:
        yield
    finally:
        if hooks:
            module.enable_hooks()


@contextmanager
def frozen_module(net: nn.Module, wrapped: nn.Module) -> Iterator[None]:
    """``net``'s trainable parameters frozen and the hooks of its Opacus wrapper ``wrapped`` off:
    a generator step through it leaves no gradient and no per-sample row behind."""
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        with hooks_disabled(wrapped):
            yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _wrap(D: nn.Module, grad_sample_mode: str) -> nn.Module:
    """Opacus grad-sample wrapper; "sum" so rows are exact per-example gradients."""
    from opacus.grad_sample.utils import wrap_model

    return wrap_model(D, grad_sample_mode, batch_first=True, loss_reduction="sum")


def _check_trainer_args(
    loss: str, mode: str, noise_multiplier: float, max_grad_norm: float, sample_rate: float
) -> None:
    if loss not in ("ns", "wgan-gp"):
        raise ValueError(f"loss must be 'ns' or 'wgan-gp', got {loss!r}")
    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {mode!r}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")


def fake_accuracy(fake_scores: Tensor) -> float:
    """Fraction of fakes D calls fake (logit < 0): the free proxy adaptive n_D watches."""
    if fake_scores.numel() == 0:
        return math.nan
    return float((fake_scores < 0).float().mean())
