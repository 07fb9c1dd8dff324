"""Fed-Avg GAN (Augenstein et al. 2020), framework-free: the whole method.

Per round: the server samples every available client independently with probability q = m/K
(secret, Poisson) and sends G and D to those sampled; each takes up to ``local_steps`` SGD steps on D
with the WGAN-GP loss (its real data, fakes from the frozen G) and returns its raw D delta
(``client_update``); the server aggregates them with user-level DP-FedAvg (``common/dp_fedavg.py``:
clip to S, sum, N(0, (zS)^2), divide by the fixed m), applies the result, then takes a few generator
steps against the new D (``server_generator_steps``: post-processing, no privacy cost).

Privacy: the server's ledger holds one Poisson-subsampled Gaussian (z, q) per round that released a
noised D, the user-level figure with a trusted server. The server sees raw deltas, so each client's
own ledger holds a void event per delta: against an untrusted server its ε is unbounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from common.calibration import subsampled_noise
from common.codec import PayloadError
from common.dp_fedavg import Delta, delta_mismatch, flatten_delta
from common.losses import critic_step
from common.messages import StateDict
from common.methods import core
from common.models import build_discriminator, build_generator, device_of, on_cpu, sample_latent
from common.options import check, check_all, option
from common.privacy import PrivacyEvent
from common.privacy.events import VOID_RAW_DELTA

if TYPE_CHECKING:  # a type only: common.config composes this module's options
    from common.config import ExperimentConfig

MSG_ROUND = "train.fedavg"
STEP_LABEL = "rounds"
ACCEPTS_PRIOR_RELEASES = False
UNBOUNDED_AGAINST_SERVER = True  # clients send raw deltas: a node with a finite max-epsilon refuses
RAW_DELTA = PrivacyEvent(noise_multiplier=0.0, void=VOID_RAW_DELTA)  # what each delta sent costs a client


@dataclass(frozen=True)
class Options:
    """Fed-Avg GAN's section of the configuration."""

    fedavg_clients_per_round: int = option(
        10,
        "fedavg-gan: expected clients m per round: each client is sampled independently with "
        "probability q = m/K (DP-FedAvg's Poisson sampling) and the noisy sum is divided by the fixed m",
    )
    local_steps: int = option(6, "fedavg-gan: local WGAN-GP SGD steps of D per client per round")
    server_g_steps: int = option(6, "fedavg-gan: generator SGD steps on the server per round")
    fedavg_lr_d: float = option(5e-4, "fedavg-gan: clients' discriminator SGD learning rate")
    fedavg_lr_g: float = option(5e-3, "fedavg-gan: server's generator SGD learning rate")
    fedavg_clip: float = option(0.1, "fedavg-gan: L2 clip S of each client's whole discriminator delta")
    fedavg_noise_multiplier: float = option(
        0.01, "fedavg-gan: noise multiplier z (noise std zS on the sum of clipped deltas)"
    )


def validate(c: ExperimentConfig) -> None:
    check_all(c, ("fedavg_clients_per_round", "local_steps", "server_g_steps"), lambda v: v >= 1, "must be >= 1")
    if core(c.strategy).__name__ == __name__:  # only a Fed-Avg run samples m clients per round
        check(
            c.fedavg_clients_per_round <= len(c.participants()),
            "fedavg_clients_per_round",
            c.fedavg_clients_per_round,
            f"more than the {len(c.participants())} clients taking part",
        )
    check_all(c, ("fedavg_lr_d", "fedavg_lr_g", "fedavg_clip"), lambda v: v > 0, "must be > 0")
    check_all(c, ("fedavg_noise_multiplier",), lambda v: v >= 0, "must be >= 0")


@dataclass
class FedAvgRound:
    """Server -> sampled client: G and D, the round and a seed for the client's public randomness."""

    step: int
    seed: int
    generator: StateDict
    discriminator: StateDict


@dataclass
class FedAvgReply:
    step: int
    delta: StateDict  # the raw delta of D's floating-point state after the local steps

    def decoded(self, *, step: int, shapes: dict[str, tuple[int, ...]] | None = None) -> FedAvgReply:
        """The reply checked against the round it answers and, given ``shapes`` (D's floating-point
        entries), against D: a delta that does not fit is this sender's malformed reply."""
        if self.step != step:
            raise PayloadError(f"the delta is for round {self.step}, expected round {step}")
        problem = delta_mismatch(self.delta, shapes) if shapes is not None else ""
        if problem:
            raise PayloadError(f"the delta does not fit the discriminator: {problem}")
        return self


MESSAGES = {MSG_ROUND: (FedAvgRound, FedAvgReply)}


def generator_updates(cfg: ExperimentConfig, steps: int) -> int:
    """Generator updates in ``steps`` steps of the loop (for comparisons across methods)."""
    return steps * cfg.server_g_steps


# --- privacy ------------------------------------------------------------------------------------
def release_noise(cfg: ExperimentConfig) -> float:
    """A client adds no noise: the server does (its ``fedavg_noise_multiplier``), so 0, below any
    node minimum; a node sends raw deltas only when its policy trusts the server."""
    return 0.0


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return []


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """z for the user-level, trusted-server ε of the rounds (Poisson, q = m/K); per-client ε
    against the server stays unbounded whatever the noise, which the report says."""
    q = min(1.0, cfg.fedavg_clients_per_round / len(cfg.participants()))
    return cfg.replace(fedavg_noise_multiplier=subsampled_noise(cfg.target_epsilon, q, cfg.steps, cfg.delta))


# --- client: local discriminator steps ---------------------------------------------------------


@torch.no_grad()
def _fakes(G: nn.Module, n: int, *, z_dim: int, num_classes: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` fakes from the frozen G with uniformly drawn labels."""
    device = device_of(G)
    y = torch.randint(0, num_classes, (n,), generator=generator).to(device)
    return G(sample_latent(n, z_dim, generator=generator).to(device), y), y


def client_update(
    G_state: dict[str, Tensor],
    D_state: dict[str, Tensor],
    *,
    preset: str,
    num_classes: int,
    z_dim: int,
    real_images: Tensor,
    real_labels: Tensor,
    local_steps: int = 6,
    lr: float = 5e-4,
    batch_size: int = 32,
    gp_weight: float = 10.0,
    drift: float = 1e-3,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> Delta:
    """One client's round: up to ``local_steps`` SGD steps on D, returns its raw D delta.

    "Up to": one shuffled pass over the local data, stopping after ``local_steps`` batches (the
    last batch may be smaller), as in Augenstein et al. G is rebuilt from ``G_state`` and used in
    eval mode under ``no_grad``, so it is never changed. The delta covers D's whole state,
    buffers included (see :func:`flatten_delta`); clipping and noise happen on the server. The
    networks train on ``device``; ``generator`` (the round's public seed) stays on the CPU and the
    delta comes back on the CPU, ready for the wire.
    """
    if real_images.shape[0] != real_labels.shape[0] or real_images.shape[0] == 0:
        raise ValueError("real_images and real_labels must be non-empty and equally long")
    G = build_generator(preset, z_dim=z_dim, num_classes=num_classes).to(device)
    G.load_state_dict(G_state)
    G.eval().requires_grad_(False)
    D = build_discriminator(preset, num_classes=num_classes).to(device)
    D.load_state_dict(D_state)
    D.train()
    optimizer = torch.optim.SGD(D.parameters(), lr=lr)
    order = torch.randperm(real_images.shape[0], generator=generator)
    for batch in order.split(batch_size)[:local_steps]:
        fake, fake_y = _fakes(G, len(batch), z_dim=z_dim, num_classes=num_classes, generator=generator)
        real, real_y = real_images[batch].to(device), real_labels[batch].to(device)
        critic_step(
            D,
            optimizer,
            real,
            real_y,
            fake,
            fake_y,
            gp_weight=gp_weight,
            drift=drift,
            generator=generator,
        )
    return on_cpu(flatten_delta(D_state, D.state_dict()))


# --- server: generator steps against the updated D ---------------------------------------------


def server_generator_steps(
    G: nn.Module,
    D: nn.Module,
    *,
    steps: int = 6,
    lr: float = 5e-3,
    batch_size: int = 32,
    z_dim: int,
    num_classes: int,
    generator: torch.Generator,
) -> dict[str, float]:
    """``steps`` SGD steps on G minimizing ``-mean D(G(z, y), y)`` with uniform labels.

    Post-processing of the privatized D, so it costs no privacy. D is held in eval mode with its
    parameters frozen for the duration (its power-iteration buffers are not advanced, so D is
    exactly unchanged), then its mode and ``requires_grad`` flags are restored.
    """
    was_training = D.training
    flags = [p.requires_grad for p in D.parameters()]
    D.eval().requires_grad_(False)
    optimizer = torch.optim.SGD(G.parameters(), lr=lr)
    device = device_of(G)
    G.train()
    losses: list[float] = []
    try:
        for _ in range(steps):
            y = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
            z = sample_latent(batch_size, z_dim, generator=generator).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = -D(G(z, y), y).mean()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        D.train(was_training)
        for p, flag in zip(D.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    mean = sum(losses) / len(losses) if losses else float("nan")
    last = losses[-1] if losses else float("nan")
    return {"g_steps": float(steps), "g_loss": last, "g_loss_mean": mean}
