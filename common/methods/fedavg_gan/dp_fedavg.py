"""User-level DP-FedAvg on model updates (McMahan et al. 2018), as Fed-Avg GAN runs it on D.

Each round every client is sampled independently with probability q = m/K (Poisson, from a secret
CSPRNG); each sampled client returns its raw update (delta); the server clips each delta to L2 norm
S, sums, adds N(0, (zS)^2 I) and divides by the FIXED expected number m = qK.

This is DP-FedAvg as published (McMahan et al. 2018, fixed denominator qW): Poisson sampling and
add/remove adjacency are what the subsampled-Gaussian bound assumes (a server taking exactly m
clients would need the without-replacement bound instead). Why the fixed denominator: with the
sum's sensitivity S (add/remove one client), dividing by the number that *replied* would make the
denominator data-dependent and the noise on the mean too small; dividing by m keeps the mechanism
exactly "Gaussian on the clipped sum, then a public rescaling". A round where nobody was sampled
still releases noise (its emptiness depends on who is in the federation), and a non-finite delta
counts as zero: dropping it, or the round, would make the release depend on the data.

Flower 1.41's ``DifferentialPrivacyServerSideFixedClipping`` (``flwr/serverapp/strategy/
dp_fixed_clipping.py``) was read, not imported. It clips each reply's whole-record update
``reply - current`` to L2 norm S (FlatClip, over every array in one ArrayRecord, buffers
included), lets the wrapped FedAvg average the clipped models, then adds N(0, (zS/m)^2) with
m = ``num_sampled_clients``. That equals this module's mechanism ONLY when (a) exactly m
clients reply, and (b) the FedAvg weights are equal. Otherwise it differs:

- FedAvg divides by the total weight of the replies (by default ``num-examples``), not by m: a
  missing client makes the mean's sensitivity S/n > S/m while the noise stays zS/m
  (``validate_replies`` only logs a warning unless an accountant is attached, which makes it
  strict and requires equal weights);
- weights default to example counts, so one client's contribution is not bounded by S/m;
- each ArrayRecord of a reply is clipped separately (G and D in two records -> norm up to S*sqrt2);
- noise comes from the global ``np.random`` and is cast to each array's dtype (integer buffers
  get truncated noise; clipping an integer array in place with a float factor raises);
- its built-in accountant supports only no-amplification accounting, not q = m/K.
So it can be reused only with uniform weights, the strict (accounted) reply check, a single
ArrayRecord of float arrays, and our own amplified accountant; this module is the reference.

No flwr import: Fed-Avg GAN's server side (``server.py``) calls these pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from common.privacy import PrivacyEvent

Delta = dict[str, Tensor]


# --- deltas: flatten, measure, clip, apply ---------------------------------------------------


def flatten_delta(old: dict[str, Tensor], new: dict[str, Tensor]) -> Delta:
    """``new - old`` for every floating-point entry of two state_dicts with the same keys.

    Buffers such as spectral norm's ``_u``/``_v`` vectors or BatchNorm running statistics are
    floating point and are included: user-level DP-FedAvg clips the *whole* D, and a buffer shaped by
    local data leaks as much as a weight does. Integer and bool buffers (BatchNorm's
    ``num_batches_tracked``) are deliberately left out: they are counters, not learned from data
    values; averaging and noising them is meaningless; and the server keeps its own copy, which
    :func:`apply_delta` leaves untouched. The result is detached, in the entries' own dtype.
    """
    if old.keys() != new.keys():
        missing = sorted(set(old) ^ set(new))
        raise ValueError(f"state_dicts differ in keys: {missing}")
    delta: Delta = {}
    for name, old_t in old.items():
        new_t = new[name]
        if old_t.shape != new_t.shape:
            raise ValueError(f"{name}: shape {tuple(old_t.shape)} != {tuple(new_t.shape)}")
        if old_t.is_floating_point():
            delta[name] = (new_t.detach() - old_t.detach().to(new_t.device)).clone()
    return delta


def weights_only(delta: Delta, model: nn.Module) -> Delta:
    """The entries of ``delta`` that are ``model``'s parameters (``fedavg_delta = weights``).

    Spectral norm's power-iteration vectors ``_u``/``_v`` are buffers: a function of the weights
    and of the vectors the round started from, not learned from the data. Kept in the delta they
    dominate its norm (about 1.1 of a 1.14 delta for ``small`` at lr 5e-4, against 0.02 for the
    weights), so a clip S = 0.1 shrank the weights' update about 60-fold and D never learned. Left
    out, they stay on the client; the server refreshes its own (:func:`refresh_power_iteration`).
    """
    names = {name for name, _ in model.named_parameters()}
    return {k: v for k, v in delta.items() if k in names}


@torch.no_grad()
def refresh_power_iteration(model: nn.Module, *, iterations: int) -> None:
    """Run ``iterations`` power iterations of every spectral-normalized weight of ``model``.

    PyTorch's spectral norm parametrization advances ``_u``/``_v`` each time the weight is read
    in training mode; reading it here (no forward, no data) moves the server's vectors to its
    averaged weights: post-processing of the released D. ``model``'s mode is restored.
    """
    was_training = model.training
    model.train()
    try:
        for _ in range(iterations):
            for module in model.modules():
                if parametrize.is_parametrized(module, "weight"):
                    module.weight  # noqa: B018  (the read is the power iteration)
    finally:
        model.train(was_training)


def delta_norm(delta: Delta) -> float:
    """Whole-vector L2 norm over all entries (the FlatClip norm), accumulated in float64."""
    total = sum(float(t.detach().double().pow(2).sum()) for t in delta.values())
    return math.sqrt(total)


def clip_delta(delta: Delta, *, clip_norm: float) -> tuple[Delta, bool]:
    """Scale ``delta`` by ``min(1, S / ||delta||)``; returns (clipped copy, whether it was scaled).

    Whole-vector clipping bounds one client's contribution to the sum by S, which is the
    sensitivity the Gaussian noise is calibrated to.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    norm = delta_norm(delta)
    if norm <= clip_norm:
        return {k: v.clone() for k, v in delta.items()}, False
    scale = clip_norm / norm
    return {k: v * scale for k, v in delta.items()}, True


@torch.no_grad()
def apply_delta(model: nn.Module, delta: Delta) -> None:
    """Add ``delta`` in place to ``model``'s floating-point parameters and buffers.

    The delta must cover exactly the model's floating-point state entries (what
    :func:`flatten_delta` produces), so a mismatched architecture fails loudly instead of
    silently updating part of D. Integer buffers are left as they are.
    """
    state = model.state_dict(keep_vars=True)
    expected = {k for k, v in state.items() if v.is_floating_point()}
    if set(delta) != expected:
        raise ValueError(f"delta keys differ from the model's: {sorted(set(delta) ^ expected)}")
    for name, d in delta.items():
        target = state[name]
        if d.shape != target.shape:
            raise ValueError(f"{name}: delta shape {tuple(d.shape)} != {tuple(target.shape)}")
        target.data.add_(d.to(device=target.device, dtype=target.dtype))


# --- server-side aggregation -------------------------------------------------------------------


@dataclass(frozen=True)
class AggregationInfo:
    """What one call of :func:`aggregate_deltas` did; drives the ledger, not the config.

    ``noise_std`` is the per-coordinate std on the *mean* (zS/m). Call :meth:`privacy_event`
    with the population size K to get the subsampled-Gaussian event for the accountant.
    """

    noise_multiplier: float
    clip_norm: float
    num_sampled: int
    num_replied: int
    num_clipped: int
    noise_std: float
    norms: tuple[float, ...] = field(default=())

    def privacy_event(self, *, num_clients: int, void: str = "") -> PrivacyEvent:
        """One round of the Poisson-subsampled Gaussian: multiplier z, sample rate q = m/K."""
        if num_clients < self.num_sampled:
            raise ValueError(f"num_clients {num_clients} < num_sampled {self.num_sampled}")
        return PrivacyEvent(
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.num_sampled / num_clients,
            sampling="poisson",
            void=void,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
            "num_sampled": self.num_sampled,
            "num_replied": self.num_replied,
            "num_clipped": self.num_clipped,
            "noise_std": self.noise_std,
        }


def delta_mismatch(delta: Delta, shapes: dict[str, tuple[int, ...]]) -> str:
    """Why ``delta`` cannot be a delta of D (""): other entries than ``shapes`` names, an entry of
    another shape, or one that is not floating point. No honest client sends such a delta whatever
    its data, so saying so releases nothing about the data (unlike a non-finite one, see
    ``_check_deltas``), and the sender can be dropped from the round by name."""
    if delta.keys() != shapes.keys():
        missing, extra = sorted(set(shapes) - set(delta)), sorted(set(delta) - set(shapes))
        return f"its entries differ from the discriminator's (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, t in delta.items():
        if tuple(t.shape) != tuple(shapes[name]):
            return f"{name} has shape {tuple(t.shape)}, expected {tuple(shapes[name])}"
        if not t.is_floating_point():
            return f"{name} has dtype {t.dtype}, expected a floating-point dtype"
    return ""


def _check_deltas(deltas: list[Delta], template: Delta) -> list[Delta]:
    """Same keys and shapes as ``template`` everywhere (``delta_mismatch``: a caller drops such a
    delta by its sender first; here it is an error naming its place in ``deltas``); a delta holding
    NaN or inf is replaced by zeros, silently: whether a client's local steps diverged is
    data-dependent, and saying so would be an unaccounted release."""
    shapes = {name: tuple(t.shape) for name, t in template.items()}
    out = []
    for i, delta in enumerate(deltas):
        problem = delta_mismatch(delta, shapes)
        if problem:
            raise ValueError(f"delta {i} of {len(deltas)}: {problem}")
        finite = all(bool(torch.isfinite(t).all()) for t in delta.values())
        out.append(delta if finite else {k: torch.zeros_like(v) for k, v in delta.items()})
    return out


def _gaussian_like(t: Tensor, std: float, generator: torch.Generator) -> Tensor:
    """N(0, std^2) noise shaped like ``t``, drawn on the CPU generator then moved to ``t``."""
    noise = torch.randn(t.shape, generator=generator, dtype=torch.float64)
    return (noise * std).to(device=t.device, dtype=t.dtype)


def aggregate_deltas(
    deltas: list[Delta],
    *,
    template: Delta,
    clip_norm: float,
    noise_multiplier: float,
    num_sampled: int,
    generator: torch.Generator,
) -> tuple[Delta, AggregationInfo]:
    """``(sum_i clip(delta_i, S) + N(0, (zS)^2 I)) / m`` with m = ``num_sampled``, fixed.

    Any number of replies, none included (Poisson sampling: the sample size is random; a client
    that failed contributes nothing): the denominator stays m and the noise is always added, see
    the module docstring. ``template`` gives the keys, shapes and dtypes (D's floating-point state).
    """
    if num_sampled < 1:
        raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    deltas = _check_deltas(deltas, template)
    clipped = [clip_delta(d, clip_norm=clip_norm) for d in deltas]
    sum_std = noise_multiplier * clip_norm
    aggregate: Delta = {}
    for name, ref in template.items():
        total = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for c, _ in clipped:
            total = total + c[name].to(device=ref.device, dtype=torch.float64)
        if sum_std > 0:
            total = total + _gaussian_like(total, sum_std, generator)
        aggregate[name] = (total / num_sampled).to(ref.dtype)
    info = AggregationInfo(
        noise_multiplier=float(noise_multiplier),
        clip_norm=float(clip_norm),
        num_sampled=num_sampled,
        num_replied=len(deltas),
        num_clipped=sum(was for _, was in clipped),
        noise_std=sum_std / num_sampled,
        norms=tuple(delta_norm(d) for d in deltas),
    )
    return aggregate, info
