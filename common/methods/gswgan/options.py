"""GS-WGAN's section of the configuration (``ExperimentConfig`` composes it) and its own checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.options import check, check_all, check_choice, option

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

WIRE_DTYPES = ("float32", "float16")
WIRE_SAMPLES = ("uint8", "float32")
WIRE_COMPRESSIONS = ("deflate", "none")
CRITIC_FAKES = ("fresh", "query", "replay")


@dataclass(frozen=True)
class Options:
    """GS-WGAN's section of the configuration."""

    n_critic: int = option(5, "local WGAN-GP discriminator steps per query")
    clients_per_step: int = option(1, "clients m sampled uniformly per generator step")
    noise_multiplier: float = option(
        1.07, "sigma: noise std is 2*sigma*clip per coordinate (relative to sensitivity 2*clip)"
    )
    clip: float = option(1.0, "per-sample L2 clipping bound C of the generator gradient")
    lr_g: float = option(1e-4, "generator Adam learning rate")
    lr_d: float = option(1e-4, "discriminator Adam learning rate")
    warmup_steps: int = option(
        0,
        "non-private warm-start iterations of each client's D on first contact (free in privacy: D is never "
        "released); done once and kept in the client's state, each iteration costs one critic step: ~14-20 ms "
        "for the small model, ~260-470 ms for the paper model on this project's 2-core CPU, so 100 iterations "
        "for 50 clients add ~75 s to a run. A seeded run's D starts from the server's critic, which does not "
        "replace this: measured, answers agree with a 2,000-iteration D's only after hundreds of iterations",
    )
    wire_dtype: str = option(
        "float16",
        "dtype of the noisy gradients on the uplink, float16 or float32 (float16 is cast after "
        "the noise: post-processing, the privacy ledger is unchanged)",
    )
    wire_samples: str = option(
        "uint8",
        "encoding of the generated samples on the downlink, uint8 (8-bit levels; the client "
        "trains and differentiates at the dequantized images) or float32",
    )
    wire_compression: str = option(
        "deflate", "lossless compression of the wire arrays, deflate (level 1, only where it is smaller) or none"
    )
    critic_fakes: str = option(
        "fresh",
        "fakes of the clients' critic steps: fresh (the server sends n_critic extra batches), "
        "query (reuse the queried batch), replay (reuse a client-side buffer of recently received "
        "batches, kept in memory only); query and replay send one batch per step",
    )
    replay_batches: int = option(5, "critic_fakes=replay: received batches a client keeps for its critic steps")
    grad_dct: int = option(
        0,
        "k > 0: release each per-sample gradient as its k x k lowest 2-D DCT frequencies (a fixed public "
        "basis) instead of all 28 x 28 pixels, clipped and noised there; the mechanism and its epsilon are "
        "unchanged, the noise per sample shrinks by 28/k and the uplink by (28/k)^2, detail finer than "
        "~28/k pixels is lost from the signal; 0: pixels, GS-WGAN as published",
    )
    stack_clients: bool = option(
        True,
        "in-process simulations: when a step queries m > 1 clients, their critic phases run as one stacked "
        "network (grouped convolutions: each client still trains its own D on its own data, draws from its own "
        "RNG, sanitizes with its own noise and ends where it would alone, up to float rounding); far fewer, "
        "larger kernels, which is how one GPU serves many clients. Off: one client after another. Flower's "
        "runtimes hand each message to its own ClientApp, so they always compute clients one by one",
    )
    cuda_graphs: bool = option(
        True,
        "on a CUDA device, a client's critic steps and its release gradient replay CUDA graphs captured once "
        "per process (GS-WGAN's critic_graph.py: the client's D and Adam are copied into one captured network and "
        "back, so it ends where the eager steps would, up to float rounding); a no-op on the CPU, for m > 1 "
        "stacked clients and for DPAC",
    )
    client_stats: bool = option(
        False,
        "clients also send their critic statistics (Wasserstein estimate, losses, gradient norms) "
        "for the training curves; they are computed on private data WITHOUT noise, so this voids the privacy "
        "guarantee: debugging on non-sensitive data only (off: only the sanitized gradient leaves a client)",
    )


def validate(c: ExperimentConfig) -> None:
    """The section's own checks (``ExperimentConfig`` runs them with every other section's)."""
    for name, choices in (
        ("wire_dtype", WIRE_DTYPES),
        ("wire_samples", WIRE_SAMPLES),
        ("wire_compression", WIRE_COMPRESSIONS),
        ("critic_fakes", CRITIC_FAKES),
    ):
        check_choice(c, name, choices)
    check(c.replay_batches >= 1, "replay_batches", c.replay_batches, "must be >= 1")
    check(c.n_critic >= 0, "n_critic", c.n_critic, "must be >= 0")
    check(
        1 <= c.clients_per_step <= c.num_clients,
        "clients_per_step",
        c.clients_per_step,
        f"must be between 1 and num_clients={c.num_clients}",
    )
    check(c.noise_multiplier >= 0, "noise_multiplier", c.noise_multiplier, "must be >= 0")
    check(c.clip > 0, "clip", c.clip, "must be > 0")
    check_all(c, ("lr_g", "lr_d"), lambda v: v > 0, "must be > 0")
    check(c.warmup_steps >= 0, "warmup_steps", c.warmup_steps, "must be >= 0")
    check(0 <= c.grad_dct <= 28, "grad_dct", c.grad_dct, "must be in [0, 28] (0: pixels)")
