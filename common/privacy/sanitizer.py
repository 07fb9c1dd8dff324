"""The client-side GS-WGAN sanitizer: clip per-sample gradients, add Gaussian noise, report the event.

Following TF Privacy's ``dp_query`` pattern, the function that adds the noise also returns the
privacy event it performed, so the ledger is driven by what actually ran, never by the config.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .analysis import Event, check_event, query_noise_multiplier

# Added to the norm before dividing so an all-zero gradient is scaled by 1 instead of 0/0.
_NORM_EPS = 1e-12


@dataclass(frozen=True)
class PrivacyEvent:
    """``count`` runs of a Gaussian mechanism, noise std = ``noise_multiplier`` × L2 sensitivity.

    ``sample_rate`` is 1 for a GS-WGAN query seen by the client itself (it knows it was asked, so
    there is no amplification from its point of view).
    """

    noise_multiplier: float
    sample_rate: float
    count: int = 1

    def __post_init__(self) -> None:
        check_event(self.astuple())
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")

    def astuple(self) -> Event:
        """The ``(noise_multiplier, sample_rate, count)`` triple that ``analysis`` composes."""
        return (self.noise_multiplier, self.sample_rate, self.count)

    def same_mechanism(self, other: PrivacyEvent) -> bool:
        """True when ``other`` is the same mechanism, so the two can be merged into one run."""
        return (self.noise_multiplier, self.sample_rate) == (other.noise_multiplier, other.sample_rate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": float(self.noise_multiplier),
            "sample_rate": float(self.sample_rate),
            "count": int(self.count),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyEvent:
        return cls(
            noise_multiplier=float(data["noise_multiplier"]),
            sample_rate=float(data["sample_rate"]),
            count=int(data.get("count", 1)),
        )


def noise_generator(
    seed: int | None = None, *, device: str | torch.device = "cpu"
) -> torch.Generator:
    """Generator for the DP noise, seeded from the OS CSPRNG (``secrets``) unless ``seed`` is given.

    A fixed seed makes the noise predictable to anyone who knows it, which voids the guarantee: it
    is for tests only. Note that torch's generator (Philox/Mersenne Twister) is not itself a
    CSPRNG; the secret seed prevents anyone from replaying the noise from the config.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(64) if seed is None else seed)
    return generator


def sanitize_sample_grads(
    grads: torch.Tensor, *, clip: float, noise_multiplier: float, generator: torch.Generator
) -> tuple[torch.Tensor, PrivacyEvent]:
    """Clip each sample's gradient to L2 norm ``clip`` and add N(0, (2σC)²) per coordinate.

    ``grads`` is ``[B, ...]``; the norm is over all non-batch dimensions. Replace-one sensitivity of
    one clipped sample is 2C, so noise std 2σC makes each sample a σ-Gaussian mechanism and the B
    samples together one mechanism with noise multiplier σ/√B (returned as the event).

    σ=0 releases the clipped gradients in the clear; its event (noise multiplier 0) makes ε infinite.
    The noise is drawn on ``generator``'s device and moved to ``grads``' device.

    Raises ValueError on NaN/inf gradients: clipping would turn NaN into NaN and inf into a
    data-dependent direction, and answering would charge the ledger for a useless reply.
    """
    _check_inputs(grads, clip=clip, noise_multiplier=noise_multiplier)
    batch_size = grads.shape[0]
    with torch.no_grad():
        work = grads.detach().to(torch.promote_types(grads.dtype, torch.float32))
        clipped = clip_sample_grads(work, clip=clip)
        if noise_multiplier > 0:
            noise = torch.randn(
                work.shape, generator=generator, device=generator.device, dtype=work.dtype
            )
            clipped = clipped + noise.to(work.device) * (2.0 * noise_multiplier * clip)
        sanitized = clipped.to(grads.dtype)
    event = PrivacyEvent(
        noise_multiplier=query_noise_multiplier(noise_multiplier=noise_multiplier, batch_size=batch_size),
        sample_rate=1.0,
    )
    return sanitized, event


def clip_sample_grads(grads: torch.Tensor, *, clip: float) -> torch.Tensor:
    """Scale each sample by ``min(1, C / (‖g_i‖ + 1e-12))`` (norm over all non-batch dims)."""
    norms = grads.reshape(grads.shape[0], -1).to(torch.float64).norm(dim=1)
    scale = (clip / (norms + _NORM_EPS)).clamp(max=1.0).to(grads.dtype)
    return grads * scale.view(-1, *([1] * (grads.dim() - 1)))


def _check_inputs(grads: torch.Tensor, *, clip: float, noise_multiplier: float) -> None:
    if grads.dim() < 1 or grads.shape[0] < 1:
        raise ValueError(f"grads must be [B, ...] with B >= 1, got shape {tuple(grads.shape)}")
    if not grads.is_floating_point():
        raise ValueError(f"grads must be floating point, got {grads.dtype}")
    if not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"clip must be finite and > 0, got {clip}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    if not bool(torch.isfinite(grads).all()):
        bad = int((~torch.isfinite(grads.reshape(grads.shape[0], -1))).any(dim=1).sum())
        raise ValueError(
            f"{bad} of {grads.shape[0]} per-sample gradients contain NaN or inf; refusing to "
            "sanitize (the discriminator has diverged; nothing was released or charged)"
        )
