"""A GS-WGAN client's discriminator work, never released: its critic steps (on fresh, queried or
replayed fakes), and what it does once before its first answer (the warm starts, DPAC's init).

None of these networks leaves the client, so none of this costs privacy; only the sanitized
answer does (``client.py``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from common.client_state import ClientState, client_seed
from common.data import num_classes_for
from common.learning.dpac import classifier_step, train_classifier
from common.learning.losses import draw_alpha
from common.learning.models import build_generator, device_of, sample_latent
from common.learning.public_warmup import public_batch

from . import critic_graph

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

WARM_START_STREAM = 0x5EED  # offsets a client's seed for its warm start's throwaway generator
REPLAY_ATTR = "replay_fakes"  # attribute of ClientState holding the replay buffer (in memory only)


def real_batch(state: ClientState, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B distinct real images of the client's partition, drawn with the client's own cursor."""
    idx = torch.randperm(len(state.data.labels), generator=state.data_rng)[:batch_size]
    device = device_of(state.discriminator)
    return state.data.images[idx].to(device), state.data.labels[idx].to(device)


def critic_steps(
    state: ClientState,
    cfg: ExperimentConfig,
    fakes: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    critic: critic_graph.Critic | None = None,
) -> dict[str, torch.Tensor]:
    """n_critic WGAN-GP steps of D_k, one per fake batch; returns the last step's statistics.
    ``critic`` steps D_k (default: its own modules, eagerly; ``critic_graph.critic_session``)."""
    critic = critic or critic_graph.EagerCritic(state, cfg)
    device = device_of(state.discriminator)
    stats: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_critic):
        sl = slice(i * batch_size, (i + 1) * batch_size)
        real, real_y = real_batch(state, batch_size)
        alpha = draw_alpha(len(real_y), state.data_rng, device)
        stats = critic.critic_step(real, real_y, fakes[sl], labels[sl], alpha)
        if state.classifier is not None and state.classifier_optimizer is not None:
            train_classifier(
                state.classifier, state.classifier_optimizer, cfg.dpac_train, real, real_y, fakes[sl], labels[sl]
            )
    return stats


def select_critic_fakes(
    state: ClientState, cfg: ExperimentConfig, fakes: torch.Tensor, labels: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
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


def replay_fakes(
    state: ClientState, cfg: ExperimentConfig, fake: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
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


def warm_start(
    state: ClientState,
    cfg: ExperimentConfig,
    *,
    steps: int | None = None,
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> None:
    """Non-private warm start of D_k against a throwaway local generator (GS-WGAN's pretraining).

    Costs no privacy: neither D_k nor the throwaway generator is ever released; the first released
    answer is sanitized and accounted like every other. Runs ``warmup_steps`` critic steps; every
    ``n_critic`` of them the throwaway generator takes one step and draws the fakes the next
    ``n_critic`` critic steps reuse (each with a new real batch), as ``critic_fakes=query`` does in
    the run: one generator forward per generator step instead of one per critic step.

    ``batches(B)`` gives the real batches (default: the client's own data); ``public_warm_start``
    runs the same loop on public data.
    """
    steps = cfg.warmup_steps if steps is None else steps
    batches = batches or (lambda n: real_batch(state, n))
    num_classes = num_classes_for(cfg)
    device = device_of(state.discriminator)
    # The throwaway G's initial weights come from the client's own seed, not from whatever the
    # process's global RNG holds after the clients it served before: a client warms up the same
    # way alone, beside others in one step, or in another process.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(client_seed(cfg, state.client_id) + WARM_START_STREAM)
        gen = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(device)
    g_opt = torch.optim.Adam(gen.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2))
    g_params = list(gen.parameters())
    B = min(cfg.batch_size, len(state.data.labels))
    period = max(cfg.n_critic, 1)
    with critic_graph.critic_session(state, cfg, B) as critic:
        for it in range(steps):
            if it % period == 0:
                y = torch.randint(num_classes, (B,), generator=state.data_rng).to(device)
                fake = gen(sample_latent(B, cfg.z_dim, generator=state.data_rng).to(device), y)
            real, real_y = batches(B)
            critic.critic_step(real, real_y, fake.detach(), y, draw_alpha(len(real_y), state.data_rng, device))
            if (it + 1) % period == 0:
                # Gradients for G only: D's own are the critic's business (a graph's static buffers).
                grads = torch.autograd.grad(-critic.D(fake, y).mean(), g_params)
                for p, g in zip(g_params, grads, strict=True):
                    p.grad = g
                g_opt.step()
    state.warmed_up = True


def start_from_critic(state: ClientState, critic: dict[str, torch.Tensor]) -> None:
    """D_k's weights from the server's critic (public: derived from the seed release). One that does
    not fit this client's D is a server's mistake or malice; it fails this answer (the node's error
    names it) and costs no privacy: nothing was released."""
    try:
        state.discriminator.load_state_dict({k: v.to(device_of(state.discriminator)) for k, v in critic.items()})
    except (RuntimeError, KeyError, TypeError) as err:
        raise ValueError(f"the seed's critic does not fit this client's discriminator: {str(err)[:200]}") from err


def public_warm_start(state: ClientState, cfg: ExperimentConfig) -> None:
    """``public_warmup_steps`` critic steps of D_k on the public data (dpGAN's warm start), before
    its warm start on its own data; drawn with the client's own RNG."""
    device = device_of(state.discriminator)
    warm_start(
        state,
        cfg,
        steps=cfg.public_warmup_steps,
        batches=lambda n: public_batch(cfg, n, state.data_rng, device),
    )


def first_contact(state: ClientState, cfg: ExperimentConfig, *, critic: dict[str, torch.Tensor] | None = None) -> None:
    """What a client does once, before its first answer: D's start (a seeded run's server critic,
    ``critic``, where the query carries one), its warm starts (public data, then its own) and DPAC's
    init of C on its data. None of these networks is ever released, so none costs privacy."""
    if not state.warmed_up:
        if critic:
            start_from_critic(state, critic)
        if cfg.public_warmup_steps:
            public_warm_start(state, cfg)
        if cfg.warmup_steps:
            warm_start(state, cfg)
    if state.classifier is not None and state.classifier_optimizer is not None and not state.classifier_ready:
        for _ in range(cfg.dpac_init):
            classifier_step(state.classifier, state.classifier_optimizer, *real_batch(state, cfg.batch_size))
        state.classifier_ready = True
