"""A GS-WGAN client answering queries: budget check, first contact, n_critic local WGAN-GP steps on
D_k (never released), then the per-sample generator gradient of the queried batch, clipped and
noised on the client with its own noise, one ledger entry for the mechanism that ran, and the wire
encoding (strictly after the noise: post-processing).

``answer_queries`` answers one step's queries to m clients that share a process (the in-process
simulation): their critic phases run as one stacked network (``critic_stack.py``), each release
still sanitized with its client's own noise and charged to its own ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from common.channels import channel_for
from common.client_state import ClientState
from common.data import num_classes_for
from common.io.codec import encode_grads
from common.learning.models import device_of
from common.privacy import NodePolicy, PrivacyEvent
from common.privacy.dct import to_coefficients
from common.privacy.sanitizer import clipped_rows, release_noise_source

from ..base import or_error
from ..protocol import refusal
from . import critic_graph, critic_stack
from .critic import critic_steps, first_contact, real_batch, select_critic_fakes
from .messages import GsAnswer, GsQuery
from .privacy import planned_event, release_spec

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


class ClientDataError(ValueError):
    """A client's own partition cannot serve a query: that client fails, the others of its step go on."""


class StackedPhaseError(RuntimeError):
    """The stacked critic phase failed before any client's state changed (its data RNG is restored),
    so each client can still be answered alone."""


def partition_problem(state: ClientState, batch_size: int, num_classes: int) -> str:
    """Why this client's partition cannot serve a query (""): fewer than B images (a real batch is B
    distinct ones), or a label outside [0, num_classes) (D has no row for it; on a GPU the index
    error would poison the whole process). Checked before anything runs, so the message names the
    cause rather than a tensor shape deep in a stacked step."""
    labels = state.data.labels
    if len(labels) < batch_size:
        return f"its partition holds {len(labels)} images, fewer than batch_size={batch_size}"
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        return f"its partition has labels in [{low}, {high}], outside [0, {num_classes})"
    return ""


@dataclass
class PendingAnswer:
    """A query this client will answer, once its critic phase has run: the decoded query on the
    client's device, and the fakes and labels of its critic steps."""

    state: ClientState
    step: int
    fakes: torch.Tensor
    labels: torch.Tensor
    critic_fakes: torch.Tensor
    critic_labels: torch.Tensor
    batch_size: int


def begin_answer(
    state: ClientState, cfg: ExperimentConfig, query: GsQuery, policy: NodePolicy | None = None
) -> GsAnswer | PendingAnswer:
    """Everything before the critic phase: the refusal when the query asks for another B or the
    client's budget would be exceeded, the query decoded and checked, first contact (warm starts),
    and the critic steps' fakes. The budget and its δ are the node's (``policy``: the smaller of its
    own maximum and what the run asks for); the handler has already checked the run's configuration
    against the policy."""
    policy = policy or NodePolicy()
    B = query.batch_size
    if B != cfg.batch_size:  # B sets the query's noise multiplier σ/√B: the run's B, or nothing
        why = f"the query asks for B = {B} samples, the run's batch size is {cfg.batch_size}"
        return refusal(GsAnswer, query.step, state.client_id, why)
    over = policy.release_refusal(state.ledger, planned_event(cfg, B), cfg, "one more answer")
    if over:
        return refusal(GsAnswer, query.step, state.client_id, over)
    query = query.decoded(n_critic=cfg.n_critic, num_classes=num_classes_for(cfg), critic_fakes=cfg.critic_fakes)
    problem = partition_problem(state, B, num_classes_for(cfg))
    if problem:
        raise ClientDataError(f"client {state.client_id} cannot answer: {problem}")
    first_contact(state, cfg, critic=query.critic)
    # The images as dequantized here are the ones D_k sees and the gradient is taken at.
    device = device_of(state.discriminator)
    fakes, labels = torch.from_numpy(query.fake).to(device), torch.from_numpy(query.labels).to(device)
    critic_x, critic_y = select_critic_fakes(state, cfg, fakes, labels, B)
    return PendingAnswer(state, query.step, fakes, labels, critic_x, critic_y, B)


def finish_answer(
    pending: PendingAnswer, cfg: ExperimentConfig, grads: torch.Tensor, stats: dict[str, torch.Tensor]
) -> GsAnswer:
    """The release: ``grads`` (the per-sample gradients of the queried batch) clipped, then noised
    by the run's channel with this client's own noise (the local one: N(0, (2σC)²) per coordinate,
    ``sanitize_sample_grads``'s mechanism), one ledger entry for what the channel ran, then the wire
    encoding."""
    state = pending.state
    channel, spec = channel_for(cfg), release_spec(cfg, pending.batch_size)
    released = to_coefficients(grads, cfg.grad_dct) if cfg.grad_dct else grads
    noise, void = release_noise_source(cfg.noise_seed, state.client_id, pending.step)
    with torch.no_grad():
        noisy = channel.noised(cfg, spec, clipped_rows(released, clip=cfg.clip), noise).to(released.dtype)
    event = channel.events(cfg, spec)[0]
    ran = PrivacyEvent(noise_multiplier=event.noise_multiplier, sample_rate=1.0, void=void or event.void)
    state.ledger.record(ran)
    state.version += 1
    # Wire encoding strictly after the noise: the float16 cast and deflate are post-processing.
    grad, encoding = encode_grads(noisy.cpu().numpy(), cfg.wire_dtype, compress=cfg.wire_compression == "deflate")
    return GsAnswer(
        step=pending.step,
        grad=grad,
        grad_encoding=encoding,
        noise_multiplier=ran.noise_multiplier,
        # Statistics are computed on private data without noise: they leave only when asked for
        # (and are read off the device only then).
        stats=_client_stats(stats, grads, cfg.clip) if cfg.client_stats else {},
    )


def answer_query(
    state: ClientState, cfg: ExperimentConfig, query: GsQuery, policy: NodePolicy | None = None
) -> GsAnswer:
    """Run one GS-WGAN query on this client, or refuse it when its budget would be exceeded."""
    pending = begin_answer(state, cfg, query, policy)
    return pending if isinstance(pending, GsAnswer) else answer_pending(pending, cfg)


def answer_queries(
    states: list[ClientState], cfg: ExperimentConfig, queries: list[GsQuery], policies: list[NodePolicy]
) -> list[GsAnswer | Exception]:
    """The queries of one step to m clients (each its own state, query and policy), answered as
    ``answer_query`` answers each: with ``stack_clients``, the critic phases of the clients that can
    be stacked run as one network (``critic_stack.py``; the same results up to float
    rounding), else one by one.
    Each release is still sanitized with its client's own noise and charged to its own ledger.

    A client whose own state or data breaks its answer fails alone: its error takes its place in
    the list. When it breaks the stacked phase itself, that phase leaves every client as it was and
    the step's clients are answered one by one, so the others are answered as they would be alone."""
    begun = [or_error(begin_answer, s, cfg, q, p) for s, q, p in zip(states, queries, policies, strict=True)]
    pending = [b for b in begun if isinstance(b, PendingAnswer)]
    done: dict[int, GsAnswer | Exception] = {}
    if cfg.stack_clients and critic_stack.stackable([p.state for p in pending]):
        try:
            done = dict(zip(map(id, pending), stacked_critic_phase(pending, cfg), strict=True))
        except StackedPhaseError:
            done = {}  # one by one below: the broken client fails there, alone
    for p in pending:
        if id(p) not in done:
            done[id(p)] = or_error(answer_pending, p, cfg)
    return [done[id(b)] if isinstance(b, PendingAnswer) else b for b in begun]


def answer_pending(pending: PendingAnswer, cfg: ExperimentConfig) -> GsAnswer:
    """The critic phase of one client alone, then its release."""
    grads, stats = critic_phase(pending, cfg)
    return finish_answer(pending, cfg, grads, stats)


def critic_phase(pending: PendingAnswer, cfg: ExperimentConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One client's critic steps alone, then the queried batch's per-sample gradients (not yet
    clipped or noised) and the last step's statistics."""
    B, state = pending.batch_size, pending.state
    with critic_graph.critic_session(state, cfg, B) as critic:
        stats = critic_steps(state, cfg, pending.critic_fakes, pending.critic_labels, B, critic)
        grads = critic.sample_grads(pending.fakes[-B:], pending.labels[-B:])
    return grads, stats


def stacked_critic_phase(pending: list[PendingAnswer], cfg: ExperimentConfig) -> list[GsAnswer]:
    """``critic_steps`` and the queried batch's per-sample gradients of every pending client at once,
    then each client's release. Raises ``StackedPhaseError``, every client as it was, when the
    stacked steps fail."""
    stack, grads, stats = _stacked_steps(pending, cfg)
    stack.write_back()
    return [
        finish_answer(p, cfg, grads[k], {name: value[k] for name, value in stats.items()})
        for k, p in enumerate(pending)
    ]


def _stacked_steps(
    pending: list[PendingAnswer], cfg: ExperimentConfig
) -> tuple[critic_stack.StackedCritics, torch.Tensor, dict[str, torch.Tensor]]:
    """The stacked network after its critic steps, the per-sample gradients and the last statistics.

    Each client draws its real batches and its interpolation weights from its own data RNG in the
    order ``critic_steps`` draws them (a real batch, then the penalty's weights, per critic step), so
    it consumes its stream as it would alone. Until ``write_back`` only those RNGs change: on an
    error they are restored, so no client is left half-stepped."""
    states = [p.state for p in pending]
    rngs = [s.data_rng.get_state() for s in states]
    try:
        return _run_stacked(pending, cfg)
    except Exception as err:
        for state, rng in zip(states, rngs, strict=True):
            state.data_rng.set_state(rng)
        raise StackedPhaseError(f"the stacked critic phase failed ({type(err).__name__}: {err})") from err


def _run_stacked(
    pending: list[PendingAnswer], cfg: ExperimentConfig
) -> tuple[critic_stack.StackedCritics, torch.Tensor, dict[str, torch.Tensor]]:
    states = [p.state for p in pending]
    stack = critic_stack.StackedCritics(states)
    B = pending[0].batch_size
    device = device_of(states[0].discriminator)
    critic_x = torch.stack([p.critic_fakes for p in pending])  # [m, n_critic * B, ...]
    critic_y = torch.stack([p.critic_labels for p in pending])
    stats: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_critic):
        sl = slice(i * B, (i + 1) * B)
        reals = [real_batch(s, B) for s in states]
        alpha = torch.stack([torch.rand((B, 1, 1, 1), generator=s.data_rng) for s in states]).to(device)
        stats = stack.critic_step(
            torch.stack([x for x, _ in reals]),
            torch.stack([y for _, y in reals]),
            critic_x[:, sl],
            critic_y[:, sl],
            alpha,
            gp_weight=cfg.gp_weight,
            drift=cfg.drift,
        )
    grads = stack.sample_grads(
        torch.stack([p.fakes[-B:] for p in pending]), torch.stack([p.labels[-B:] for p in pending])
    )
    return stack, grads, stats


def _client_stats(critic: dict[str, torch.Tensor], grads: torch.Tensor, clip: float) -> dict[str, float]:
    """The critic's last statistics and the un-noised gradient norms, as floats (client_stats only)."""
    norms = grads.flatten(1).norm(dim=1)
    stats = {k: float(v) for k, v in critic.items()}
    stats["grad_norm_mean"] = float(norms.mean())
    stats["clip_fraction"] = float((norms > clip).float().mean())
    return stats
