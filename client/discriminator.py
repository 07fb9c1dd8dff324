"""What a GS-WGAN client does with one query, as plain functions over its state (no Flower here).

``answer_query`` is the whole client side of DESIGN.md §2: budget check, n_critic local WGAN-GP
steps on D_k (not private: D_k is never released), then the per-sample generator gradient of the
last batch, clipped and noised on the client, and one ledger entry for the mechanism that ran.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from common.codec import GsAnswer, GsQuery, to_wire, validate_query
from common.config import ExperimentConfig
from common.data import num_classes_for
from common.losses import critic_step, generator_sample_grads
from common.models import build_generator, sample_latent
from common.privacy import PrivacyEvent, noise_generator, query_noise_multiplier, sanitize_sample_grads

from .state import ClientState


def planned_event(cfg: ExperimentConfig, batch_size: int) -> PrivacyEvent:
    """The mechanism one answer would run: a Gaussian with noise multiplier sigma/sqrt(B)."""
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=batch_size)
    return PrivacyEvent(noise_multiplier=nm, sample_rate=1.0)


def real_batch(state: ClientState, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B distinct real images of the client's partition, drawn with the client's own cursor."""
    idx = torch.randperm(len(state.data.labels), generator=state.data_rng)[:batch_size]
    return state.data.images[idx], state.data.labels[idx]


def critic_steps(state: ClientState, cfg: ExperimentConfig, fakes: torch.Tensor, labels: torch.Tensor,
                 batch_size: int) -> dict[str, float]:
    """n_critic WGAN-GP steps of D_k, one per fake batch; returns the last step's statistics."""
    stats: dict[str, float] = {}
    for i in range(cfg.n_critic):
        sl = slice(i * batch_size, (i + 1) * batch_size)
        real, real_y = real_batch(state, batch_size)
        stats = critic_step(state.discriminator, state.optimizer, real, real_y, fakes[sl], labels[sl],
                            gp_weight=cfg.gp_weight, drift=cfg.drift, generator=state.data_rng)
    return stats


def warm_start(state: ClientState, cfg: ExperimentConfig) -> None:
    """Non-private warm start of D_k against a throwaway local generator (GS-WGAN's pretraining).

    Costs no privacy: neither D_k nor the throwaway generator is ever released; the first released
    answer is sanitized and accounted like every other.
    """
    num_classes = num_classes_for(cfg)
    gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
    g_opt = torch.optim.Adam(gen.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2))
    B = min(cfg.batch_size, len(state.data.labels))
    for it in range(cfg.warmup_steps):
        y = torch.randint(num_classes, (B,), generator=state.data_rng)
        fake = gen(sample_latent(B, cfg.z_dim, generator=state.data_rng), y)
        real, real_y = real_batch(state, B)
        critic_step(state.discriminator, state.optimizer, real, real_y, fake.detach(), y,
                    gp_weight=cfg.gp_weight, drift=cfg.drift, generator=state.data_rng)
        if (it + 1) % max(cfg.n_critic, 1) == 0:
            g_opt.zero_grad(set_to_none=True)
            (-state.discriminator(fake, y).mean()).backward()
            g_opt.step()
    state.warmed_up = True


def query_noise_source(cfg: ExperimentConfig, client_id: int, step: int) -> torch.Generator:
    """Cryptographically seeded noise; a fixed ``noise_seed`` (tests only) makes it reproducible."""
    if cfg.noise_seed < 0:
        return noise_generator(None)
    digest = hashlib.sha256(f"{cfg.noise_seed}/{client_id}/{step}".encode()).digest()
    return noise_generator(int.from_bytes(digest[:7], "big"))


def answer_query(state: ClientState, cfg: ExperimentConfig, query: GsQuery) -> GsAnswer:
    """Run one GS-WGAN query on this client, or refuse it when the budget would be exceeded."""
    B = query.batch_size
    event = planned_event(cfg, B)
    if state.ledger.would_exceed(budget=cfg.client_epsilon_budget, delta=cfg.delta, next_event=event):
        return _refusal(state, cfg, query.step)
    validate_query(query, n_critic=cfg.n_critic, num_classes=num_classes_for(cfg))
    if cfg.warmup_steps and not state.warmed_up:
        warm_start(state, cfg)
    fakes = torch.from_numpy(np.asarray(query.fake, dtype=np.float32))
    labels = torch.from_numpy(np.asarray(query.labels, dtype=np.int64))
    stats = critic_steps(state, cfg, fakes, labels, B)
    last = slice(cfg.n_critic * B, (cfg.n_critic + 1) * B)
    grads = generator_sample_grads(state.discriminator, fakes[last], labels[last])
    stats["grad_norm_mean"] = float(grads.flatten(1).norm(dim=1).mean())
    stats["clip_fraction"] = float((grads.flatten(1).norm(dim=1) > cfg.clip).float().mean())
    noisy, ran = sanitize_sample_grads(grads, clip=cfg.clip, noise_multiplier=cfg.noise_multiplier,
                                       generator=query_noise_source(cfg, state.client_id, query.step))
    state.ledger.record(ran)
    state.version += 1
    return GsAnswer(
        step=query.step,
        client_id=state.client_id,
        grad=to_wire(noisy.numpy(), cfg.wire_dtype),
        noise_multiplier=ran.noise_multiplier,
        sample_rate=ran.sample_rate,
        queries=state.ledger.queries,
        epsilon=state.ledger.epsilon(delta=cfg.delta),
        stats=stats,
    )


def _refusal(state: ClientState, cfg: ExperimentConfig, step: int) -> GsAnswer:
    eps = state.ledger.epsilon(delta=cfg.delta)
    reason = (f"client {state.client_id} refuses: one more answer would exceed its epsilon budget "
              f"{cfg.client_epsilon_budget} (spent {eps:.4g} at delta={cfg.delta})")
    return GsAnswer(step=step, client_id=state.client_id, refused=True, reason=reason,
                    queries=state.ledger.queries, epsilon=eps)
