"""The client-side GS-WGAN sanitizer: clip per-sample gradients, add Gaussian noise, report the event.

Following TF Privacy's ``dp_query`` pattern, the function that adds the noise also returns the
privacy event it performed, so the ledger is driven by what actually ran, never by the config.
"""

from __future__ import annotations

import hashlib
import math
import secrets

import torch

from .analysis import query_noise_multiplier
from .events import VOID_NOISE_SEED, PrivacyEvent

# Added to the norm before dividing so an all-zero gradient is scaled by 1 instead of 0/0.
_NORM_EPS = 1e-12


def noise_generator(seed: int | None = None, *, device: str | torch.device = "cpu") -> torch.Generator:
    """Generator for the DP noise, seeded from the OS CSPRNG (``secrets``) unless ``seed`` is given.

    A fixed seed makes the noise predictable to anyone who knows it, which voids the guarantee: it
    is for tests only. Note that torch's generator (Philox/Mersenne Twister) is not itself a
    CSPRNG; the secret seed prevents anyone from replaying the noise from the config.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(64) if seed is None else seed)
    return generator


def release_noise_source(noise_seed: int, client_id: int, stream: int) -> tuple[torch.Generator, str]:
    """(noise generator, void reason) for one release of a client: cryptographically seeded, reason
    ""; a fixed ``noise_seed`` >= 0 (tests only) makes it reproducible per (client, stream), and every
    release made with it NOT private."""
    if noise_seed < 0:
        return noise_generator(None), ""
    digest = hashlib.sha256(f"{noise_seed}/{client_id}/{stream}".encode()).digest()
    return noise_generator(int.from_bytes(digest[:7], "big")), VOID_NOISE_SEED


def sanitize_sample_grads(
    grads: torch.Tensor, *, clip: float, noise_multiplier: float, generator: torch.Generator, void: str = ""
) -> tuple[torch.Tensor, PrivacyEvent]:
    """Clip each sample's gradient to L2 norm ``clip`` and add N(0, (2σC)²) per coordinate.

    ``grads`` is ``[B, ...]``; the norm is over all non-batch dimensions. Replace-one sensitivity of
    one clipped sample is 2C, so noise std 2σC makes each sample a σ-Gaussian mechanism and the B
    samples together one mechanism with noise multiplier σ/√B (returned as the event). ``void``
    names why this release is not private after all (a seeded ``generator``), for the event.

    σ=0 releases the clipped gradients in the clear; its event (noise multiplier 0) makes ε infinite.
    The noise is drawn on ``generator``'s device and moved to ``grads``' device.

    A per-sample gradient holding NaN or inf (a diverged discriminator) is replaced by zeros before
    clipping: a zero vector is within the bound, so the answer is noised and charged like any other.
    Refusing instead would make whether (and how many) samples were bad a data-dependent release,
    and an error message counting them would reach the server unaccounted.
    """
    _check_inputs(grads, clip=clip, noise_multiplier=noise_multiplier)
    batch_size = grads.shape[0]
    with torch.no_grad():
        clipped = clipped_rows(grads, clip=clip)
        sanitized = gaussian_noised(clipped, 2.0 * noise_multiplier * clip, generator).to(grads.dtype)
    event = PrivacyEvent(
        noise_multiplier=query_noise_multiplier(noise_multiplier=noise_multiplier, batch_size=batch_size),
        sample_rate=1.0,
        void=void,
    )
    return sanitized, event


def clipped_rows(grads: torch.Tensor, *, clip: float) -> torch.Tensor:
    """``grads`` ([B, ...]) in at least float32, each row that is not finite zeroed, then clipped to
    ``clip``: what a per-sample release is before its noise."""
    work = grads.detach().to(torch.promote_types(grads.dtype, torch.float32))
    return clip_sample_grads(zero_non_finite_rows(work), clip=clip)


def gaussian_noised(values: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """``values`` plus N(0, std²) per coordinate, drawn on ``generator``'s device in ``values``' dtype
    (``values`` itself when ``std`` is 0: nothing is drawn)."""
    if std == 0:
        return values
    noise = torch.randn(values.shape, generator=generator, device=generator.device, dtype=values.dtype)
    return values + noise.to(values.device) * std


def zero_non_finite_rows(grads: torch.Tensor) -> torch.Tensor:
    """``grads`` with every sample (row) that holds a NaN or inf set to zero.

    Branch-free (no "are they all finite?" test): on a GPU such a test is a host sync per answer.
    """
    finite = torch.isfinite(grads.reshape(grads.shape[0], -1)).all(dim=1)
    return torch.where(finite.view(-1, *([1] * (grads.dim() - 1))), grads, torch.zeros_like(grads))


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
