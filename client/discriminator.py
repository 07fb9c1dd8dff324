"""What a GS-WGAN client does with one query, as plain functions over its state (no Flower here).

``answer_query`` is the whole client side of DESIGN.md §2: budget check, n_critic local WGAN-GP
steps on D_k (not private: D_k is never released), then the per-sample generator gradient of the
last batch, clipped and noised on the client, and one ledger entry for the mechanism that ran.

The critic steps train on fresh fakes sent along with the query, or reuse fakes
(``critic_fakes``): the queried batch itself, or a small buffer of recently received batches. Either
way only the queried batch's gradient is released, sanitized as always, so the privacy accounting
does not depend on that choice (nor on any wire encoding: the float16 cast follows the noise).
"""

from __future__ import annotations

import hashlib
from collections import deque

import torch

from common.codec import GsAnswer, GsQuery, encode_grads, validate_query
from common.config import ExperimentConfig
from common.data import num_classes_for
from common.losses import critic_step, generator_sample_grads
from common.models import build_generator, sample_latent
from common.privacy import NodePolicy, PrivacyEvent, noise_generator, query_noise_multiplier, sanitize_sample_grads
from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED

from .state import ClientState

REPLAY_ATTR = "replay_fakes"  # attribute of ClientState holding the replay buffer (in memory only)


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


def select_critic_fakes(state: ClientState, cfg: ExperimentConfig, fakes: torch.Tensor,
                        labels: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n_critic * B fakes and labels of the critic steps, as ``cfg.critic_fakes`` says.

    fresh: the extra batches the server sent; query: the queried batch, once per step (each step
    still draws a new real batch); replay: B draws per step from recently received batches.
    """
    if cfg.critic_fakes == "fresh":
        n = cfg.n_critic * batch_size
        return fakes[:n], labels[:n]
    query_fake, query_y = fakes[-batch_size:], labels[-batch_size:]
    if cfg.critic_fakes == "query":
        return query_fake.repeat(cfg.n_critic, 1, 1, 1), query_y.repeat(cfg.n_critic)
    return replay_fakes(state, cfg, query_fake, query_y, batch_size)


def replay_fakes(state: ClientState, cfg: ExperimentConfig, fake: torch.Tensor, y: torch.Tensor,
                 batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw each critic batch from the buffered batches plus the queried one, then buffer the latter.

    Draws use the client's own data RNG (persisted with its state), so a run is reproducible as
    long as the buffer stays in memory (see ``replay_buffer``).
    """
    buffer = replay_buffer(state, cfg.replay_batches)
    pool_x = torch.cat([*(x for x, _ in buffer), fake])
    pool_y = torch.cat([*(t for _, t in buffer), y])
    draws = [torch.randperm(len(pool_x), generator=state.data_rng)[:batch_size] for _ in range(cfg.n_critic)]
    buffer.append((fake, y))
    idx = torch.cat(draws) if draws else torch.zeros(0, dtype=torch.long)
    return pool_x[idx], pool_y[idx]


def replay_buffer(state: ClientState, capacity: int) -> deque[tuple[torch.Tensor, torch.Tensor]]:
    """The client's buffer of recently received fake batches, created empty on first use.

    It lives on the in-memory state object only, not in the state file: the fakes are public and
    a buffer that starts empty again (a fresh worker process, or the state cache evicting this
    client) only means a few critic steps on the queried batch alone, as with critic_fakes=query.
    """
    buffer = state.__dict__.get(REPLAY_ATTR)
    if buffer is None or buffer.maxlen != capacity:
        buffer = state.__dict__[REPLAY_ATTR] = deque(buffer or (), maxlen=capacity)
    return buffer


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


def query_noise_source(cfg: ExperimentConfig, client_id: int, step: int) -> tuple[torch.Generator, str]:
    """(noise generator, void reason): cryptographically seeded with reason ""; a fixed
    ``noise_seed`` (tests only) makes it reproducible, and every release made with it NOT private."""
    if cfg.noise_seed < 0:
        return noise_generator(None), ""
    digest = hashlib.sha256(f"{cfg.noise_seed}/{client_id}/{step}".encode()).digest()
    return noise_generator(int.from_bytes(digest[:7], "big")), VOID_NOISE_SEED


def answer_query(state: ClientState, cfg: ExperimentConfig, query: GsQuery,
                 policy: NodePolicy | None = None) -> GsAnswer:
    """Run one GS-WGAN query on this client, or refuse it when its budget would be exceeded.

    The budget and its δ are the node's (``policy``: the smaller of its own maximum and what the
    run asks for); the handler has already checked the run's configuration against the policy.
    """
    policy = policy or NodePolicy()
    B = query.batch_size
    if B != cfg.batch_size:  # B sets the query's noise multiplier σ/√B: the run's B, or nothing
        return _refusal(state, cfg, query.step, f"the query asks for B = {B} samples, the run's batch size is "
                        f"{cfg.batch_size}")
    event = planned_event(cfg, B)
    over = policy.over_budget(state.ledger, event, cfg)
    if over:
        return _refusal(state, cfg, query.step, f"one more answer {over}")
    fakes_np, labels_np = validate_query(query, n_critic=cfg.n_critic, num_classes=num_classes_for(cfg),
                                         critic_fakes=cfg.critic_fakes)
    if cfg.warmup_steps and not state.warmed_up:
        warm_start(state, cfg)
    # The images as dequantized here are the ones D_k sees and the gradient is taken at.
    fakes, labels = torch.from_numpy(fakes_np), torch.from_numpy(labels_np)
    stats = critic_steps(state, cfg, *select_critic_fakes(state, cfg, fakes, labels, B), B)
    grads = generator_sample_grads(state.discriminator, fakes[-B:], labels[-B:])
    stats["grad_norm_mean"] = float(grads.flatten(1).norm(dim=1).mean())
    stats["clip_fraction"] = float((grads.flatten(1).norm(dim=1) > cfg.clip).float().mean())
    noise, void = query_noise_source(cfg, state.client_id, query.step)
    noisy, ran = sanitize_sample_grads(grads, clip=cfg.clip, noise_multiplier=cfg.noise_multiplier,
                                       generator=noise, void=void or (VOID_CLIENT_STATS if cfg.client_stats else ""))
    state.ledger.record(ran)
    state.version += 1
    # Wire encoding strictly after the noise: the float16 cast and deflate are post-processing.
    grad, encoding = encode_grads(noisy.numpy(), cfg.wire_dtype, compress=cfg.wire_compression == "deflate")
    return GsAnswer(
        step=query.step,
        client_id=state.client_id,
        grad=grad,
        grad_encoding=encoding,
        noise_multiplier=ran.noise_multiplier,
        sample_rate=ran.sample_rate,
        queries=state.ledger.queries,
        epsilon=state.ledger.epsilon(delta=cfg.delta),
        # Statistics are computed on private data without noise: they leave only when asked for.
        stats=stats if cfg.client_stats else {},
    )


def _refusal(state: ClientState, cfg: ExperimentConfig, step: int, why: str) -> GsAnswer:
    """A refusal: nothing is released or charged. The reason depends only on the ledger (public
    to the server through the answers it received) and the configurations, never on the data."""
    reason = f"client {state.client_id} refuses: {why}"
    return GsAnswer(step=step, client_id=state.client_id, refused=True, reason=reason,
                    queries=state.ledger.queries, epsilon=state.ledger.epsilon(delta=cfg.delta))
