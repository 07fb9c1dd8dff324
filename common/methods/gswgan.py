"""GS-WGAN (Chen, Orekondy, Fritz 2020), federated: the whole method, framework-free (DESIGN.md §2).

- **Options**: its section of the configuration (``Options``; ``ExperimentConfig`` composes it).
- **Client side** (``answer_query``): budget check, n_critic local WGAN-GP steps on D_k (not private:
  D_k is never released), the per-sample generator gradient of the last batch, clipped and noised
  on the client, and one ledger entry for the mechanism that ran. The critic steps train on fresh
  fakes sent along with the query, or reuse fakes (``critic_fakes``): the queried batch itself, or a
  small buffer of recently received batches. Either way only the queried batch's gradient is
  released, sanitized as always, so the accounting depends neither on that choice nor on any wire
  encoding (the float16 cast follows the noise).
- **Server side** (``ServerGenerator``): G, its EMA (the only released model), Adam, the samples
  it sends, and the straight-through update from the clients' sanitized gradients.
- **Privacy**: one answered query is one Gaussian mechanism with noise multiplier σ/√B
  (``planned_event``); ``calibrate`` picks σ for ``--target-epsilon``.
- **Messages**: ``train.gswgan`` carries a ``GsQuery`` and its ``GsAnswer`` (``common/codec.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from common import critic_graph, critic_stack
from common.calibration import ledger_epsilon, smallest_noise
from common.client_state import ClientState, client_seed
from common.codec import GsAnswer, GsQuery, encode_grads
from common.data import num_classes_for
from common.device import resolve_device
from common.dpac import classifier_step, train_classifier
from common.generator_graph import GeneratorGraph
from common.losses import draw_alpha
from common.models import GeneratorEMA, build_discriminator, build_generator, device_of, sample_latent
from common.options import check, check_all, check_choice, option
from common.privacy import NodePolicy, PrivacyEvent, query_noise_multiplier, sanitize_sample_grads
from common.privacy.dct import to_coefficients, to_pixels
from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED
from common.privacy.sanitizer import release_noise_source
from common.public_warmup import public_batch, warm_gan_on_public

if TYPE_CHECKING:  # a type only: common.config composes this module's options
    from common.config import ExperimentConfig

MSG_QUERY = "train.gswgan"
MESSAGES = {MSG_QUERY: (GsQuery, GsAnswer)}
STEP_LABEL = "generator steps"
ACCEPTS_PRIOR_RELEASES = True  # its strategy reports releases made before the run (the debugging task)
UNBOUNDED_AGAINST_SERVER = False
SUPPORTS_DPAC = True  # federated DPAC: C_k beside D_k on each client, one sanitized combined gradient
WIRE_DTYPES = ("float32", "float16")
WIRE_SAMPLES = ("uint8", "float32")
WIRE_COMPRESSIONS = ("deflate", "none")
CRITIC_FAKES = ("fresh", "query", "replay")
WARM_START_STREAM = 0x5EED  # offsets a client's seed for its warm start's throwaway generator
REPLAY_ATTR = "replay_fakes"  # attribute of ClientState holding the replay buffer (in memory only)


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
        "for 50 clients add ~75 s to a run",
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
        "per process (common/critic_graph.py: the client's D and Adam are copied into one captured network and "
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


def generator_updates(cfg: ExperimentConfig, steps: int) -> int:
    """Generator updates in ``steps`` steps of the loop (for comparisons across methods)."""
    return steps


# --- privacy ------------------------------------------------------------------------------------
def release_noise(cfg: ExperimentConfig) -> float:
    """The noise multiplier of each answer as the mechanism runs, σ/√B (what a node's minimum noise
    is checked against: the server picks B, so σ alone would not bound it)."""
    return query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=cfg.batch_size)


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["noise multiplier 0 (gradients released without noise)"] if cfg.noise_multiplier == 0 else []


def planned_event(cfg: ExperimentConfig, batch_size: int) -> PrivacyEvent:
    """The mechanism one answer runs, as it will be recorded: a Gaussian with noise multiplier
    sigma/sqrt(B), void when the run uses a non-private option its nodes allowed."""
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=batch_size)
    return PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=client_void(cfg))


# An honest row's noise exceeds 2σC(√d + TAIL) with probability below exp(-TAIL²/2) ≈ 1e-14
# (Gaussian norm concentration: ‖ξ‖ ≤ √d + t except with probability exp(-t²/2)).
HONEST_TAIL = 8.0


def honest_norm_bound(cfg: ExperimentConfig) -> float:
    """The largest per-sample norm an honest answer shows except with negligible probability: the
    clipped gradient (≤ C) plus noise of std 2σC on each of its d coordinates."""
    d = cfg.grad_dct**2 if cfg.grad_dct else 28 * 28
    return cfg.clip * (1.01 + 2 * cfg.noise_multiplier * (math.sqrt(d) + HONEST_TAIL))  # 1%: float16 rounding


def implausible_norms(grad: np.ndarray, cfg: ExperimentConfig) -> str:
    """Why an answer cannot be honest (a row above ``honest_norm_bound``), or "": such an answer
    would move G by what a hostile client chose (1e30 once saturated Adam's moments for good)."""
    norms = np.sqrt(np.square(grad.reshape(grad.shape[0], -1), dtype=np.float64).sum(axis=1))
    bound = honest_norm_bound(cfg)
    if not np.all(norms <= bound):
        worst = float(np.max(norms))
        return f"a per-sample norm of {worst:.3g} exceeds {bound:.3g}, what clipping to C plus the noise allows"
    return ""


def client_void(cfg: ExperimentConfig) -> str:
    """Why a client's answers in this run are not private (""): what the node's policy allowed."""
    if cfg.noise_seed >= 0:
        return VOID_NOISE_SEED
    return VOID_CLIENT_STATS if cfg.client_stats else ""


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for ``target_epsilon``: the per-client ε of a client answering its expected share
    ceil(T·m/K) of queries reaches the target; the target also becomes the clients' budget, so one
    sampled more often than expected refuses instead of exceeding it."""
    target = cfg.target_epsilon
    queries = math.ceil(cfg.steps * cfg.clients_per_step / len(cfg.participants()))
    per_query = smallest_noise(lambda nm: ledger_epsilon(nm, 1.0, max(queries, 1), cfg.delta), target)
    budget = min(cfg.client_epsilon_budget or target, target)
    return cfg.replace(noise_multiplier=per_query * math.sqrt(cfg.batch_size), client_epsilon_budget=budget)


# --- the client's side --------------------------------------------------------------------------
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


def first_contact(state: ClientState, cfg: ExperimentConfig) -> None:
    """What a client does once, before its first answer: D's warm starts (public data, then its
    own) and DPAC's init of C on its data. None of these networks is ever released, so none costs
    privacy."""
    if not state.warmed_up:
        if cfg.public_warmup_steps:
            public_warm_start(state, cfg)
        if cfg.warmup_steps:
            warm_start(state, cfg)
    if state.classifier is not None and state.classifier_optimizer is not None and not state.classifier_ready:
        for _ in range(cfg.dpac_init):
            classifier_step(state.classifier, state.classifier_optimizer, *real_batch(state, cfg.batch_size))
        state.classifier_ready = True


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
        return _refusal(
            state, cfg, query.step, f"the query asks for B = {B} samples, the run's batch size is {cfg.batch_size}"
        )
    refusal = policy.release_refusal(state.ledger, planned_event(cfg, B), cfg, "one more answer")
    if refusal:
        return _refusal(state, cfg, query.step, refusal)
    query = query.decoded(n_critic=cfg.n_critic, num_classes=num_classes_for(cfg), critic_fakes=cfg.critic_fakes)
    problem = partition_problem(state, B, num_classes_for(cfg))
    if problem:
        raise ClientDataError(f"client {state.client_id} cannot answer: {problem}")
    first_contact(state, cfg)
    # The images as dequantized here are the ones D_k sees and the gradient is taken at.
    device = device_of(state.discriminator)
    fakes, labels = torch.from_numpy(query.fake).to(device), torch.from_numpy(query.labels).to(device)
    critic_x, critic_y = select_critic_fakes(state, cfg, fakes, labels, B)
    return PendingAnswer(state, query.step, fakes, labels, critic_x, critic_y, B)


def finish_answer(
    pending: PendingAnswer, cfg: ExperimentConfig, grads: torch.Tensor, stats: dict[str, torch.Tensor]
) -> GsAnswer:
    """The release: ``grads`` (the per-sample gradients of the queried batch) clipped and noised
    by this client with its own noise, one ledger entry, then the wire encoding."""
    state = pending.state
    released = to_coefficients(grads, cfg.grad_dct) if cfg.grad_dct else grads
    noise, void = release_noise_source(cfg.noise_seed, state.client_id, pending.step)
    noisy, ran = sanitize_sample_grads(
        released,
        clip=cfg.clip,
        noise_multiplier=cfg.noise_multiplier,
        generator=noise,
        void=void or (VOID_CLIENT_STATS if cfg.client_stats else ""),
    )
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
    be stacked run as one network (``common/critic_stack.py``; the same results up to float
    rounding), else one by one.
    Each release is still sanitized with its client's own noise and charged to its own ledger.

    A client whose own state or data breaks its answer fails alone: its error takes its place in
    the list. When it breaks the stacked phase itself, that phase leaves every client as it was and
    the step's clients are answered one by one, so the others are answered as they would be alone."""
    begun = [_or_error(begin_answer, s, cfg, q, p) for s, q, p in zip(states, queries, policies, strict=True)]
    pending = [b for b in begun if isinstance(b, PendingAnswer)]
    done: dict[int, GsAnswer | Exception] = {}
    if cfg.stack_clients and critic_stack.stackable([p.state for p in pending]):
        try:
            done = dict(zip(map(id, pending), stacked_critic_phase(pending, cfg), strict=True))
        except StackedPhaseError:
            done = {}  # one by one below: the broken client fails there, alone
    for p in pending:
        if id(p) not in done:
            done[id(p)] = _or_error(answer_pending, p, cfg)
    return [done[id(b)] if isinstance(b, PendingAnswer) else b for b in begun]


def _or_error(fn: Callable[..., GsAnswer | PendingAnswer], *args: object) -> GsAnswer | PendingAnswer | Exception:
    """``fn(*args)``, or the error it raised: one client's failure, returned in its place."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - this client fails, the others of its step go on
        return err


def answer_pending(pending: PendingAnswer, cfg: ExperimentConfig) -> GsAnswer:
    """The critic phase of one client alone, then its release."""
    B, state = pending.batch_size, pending.state
    with critic_graph.critic_session(state, cfg, B) as critic:
        stats = critic_steps(state, cfg, pending.critic_fakes, pending.critic_labels, B, critic)
        grads = critic.sample_grads(pending.fakes[-B:], pending.labels[-B:])
    return finish_answer(pending, cfg, grads, stats)


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


def _refusal(state: ClientState, cfg: ExperimentConfig, step: int, why: str) -> GsAnswer:
    """A refusal: nothing is released or charged. The reason depends only on the ledger (public
    to the server through the answers it received) and the configurations, never on the data."""
    return GsAnswer(step=step, refused=True, reason=f"client {state.client_id} refuses: {why}")


# --- the server's side --------------------------------------------------------------------------
class ServerGenerator:
    """Owns everything the server needs to produce samples and apply sanitized gradients."""

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.num_classes = num_classes
        self.device = resolve_device(cfg.device)
        self.model = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(self.device)
        self.ema = GeneratorEMA(self.model, decay=cfg.ema_decay)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr_g, betas=(cfg.beta1, cfg.beta2))
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.public_warmed = not cfg.public_warmup_steps
        self._graph: GeneratorGraph | None = None  # common/generator_graph.py, made on first use
        self._graph_query: torch.Tensor | None = None  # the queried batch the graph holds

    def _graph_for(self, batch_size: int, n_critic: int) -> GeneratorGraph | None:
        """The CUDA graphs of G's query and update where they apply: asked for, on CUDA, one client
        per step (each query is applied before the next); rebuilt if B or the critic batches change."""
        if not (self.cfg.cuda_graphs and self.device.type == "cuda" and self.cfg.clients_per_step == 1):
            return None
        graph = self._graph
        if graph is None or (graph.batch_size, graph.critic) != (batch_size, n_critic):
            graph = self._graph = GeneratorGraph(self.model, self.optimizer, self.ema, batch_size, n_critic)
        return graph

    def public_warm_start(self) -> None:
        """dpGAN's warm start of G on the public data, against a public D that is then discarded;
        the EMA restarts from the warmed G. Runs once, before the first step."""
        D = build_discriminator(self.cfg.model, num_classes=self.num_classes).to(self.device)
        self.ema = warm_gan_on_public(self.model, D, self.cfg, num_classes=self.num_classes, rng=self.rng)
        self.public_warmed = True
        self._graph = None  # a new EMA: captured again on the next query

    def draw_labels(self, n: int) -> torch.Tensor:
        """Uniform labels drawn by the server, never from a client's label histogram (it would leak)."""
        return torch.randint(self.num_classes, (n,), generator=self.rng)

    def sample(self, n: int, labels: torch.Tensor, *, grad: bool) -> torch.Tensor:
        z = sample_latent(n, self.cfg.z_dim, generator=self.rng).to(self.device)
        with torch.set_grad_enabled(grad):
            return self.model(z, labels.to(self.device))

    def query_batches(self, batch_size: int, n_critic: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n_critic+1)*B samples for one client: the critic batches without a graph, the last with.

        ``n_critic=0`` gives the queried batch only (clients that reuse fakes for their critic steps).
        Returns (all samples detached on the CPU, their labels, the last batch still attached to
        G's graph on the device).
        """
        labels = self.draw_labels((n_critic + 1) * batch_size)
        n = n_critic * batch_size
        graph = self._graph_for(batch_size, n_critic)
        if graph is not None:  # the same draws in the same order as below
            z_critic = sample_latent(n, self.cfg.z_dim, generator=self.rng) if n_critic else torch.zeros(0, 0)
            z = sample_latent(batch_size, self.cfg.z_dim, generator=self.rng)
            samples, self._graph_query = graph.query(labels, z_critic.to(self.device), z.to(self.device))
            return samples.cpu(), labels, self._graph_query
        critic = [self.sample(n, labels[:n], grad=False)] if n_critic else []
        last = self.sample(batch_size, labels[n:], grad=True)
        return torch.cat([*critic, last.detach()]).cpu(), labels, last

    def apply(self, attached: list[torch.Tensor], grads: list[torch.Tensor], divisor: float) -> bool:
        """Backpropagate the clients' sanitized gradients through G, step Adam, update the EMA.

        Straight-through estimator: with a lossy sample encoding (uint8) the clients differentiate
        at the *dequantized* images ``q(G(z))`` they received, while ``attached`` holds the
        unquantized ``G(z)``. Rounding has zero derivative almost everywhere, so the chain rule
        through ``q`` would give no signal; we treat ``q`` as the identity in the backward pass and
        apply the returned gradient at ``G(z)``. The error is at most half a level (1/510) per pixel.
        With ``grad_dct`` the clients sent DCT coefficients; they are lifted back to pixels first.
        Returns False (no step) when G's gradient is not finite.
        """
        if self._graph is not None:
            if len(attached) != 1 or attached[0] is not self._graph_query:
                raise RuntimeError("a CUDA-graph step applies the one batch it queried last (clients_per_step = 1)")
            grad = to_pixels(grads[0], self.cfg.grad_dct) if self.cfg.grad_dct else grads[0]
            return self._graph.apply(grad.to(self.device), divisor)
        self.optimizer.zero_grad(set_to_none=True)
        for fake, grad in zip(attached, grads, strict=True):
            grad = to_pixels(grad, self.cfg.grad_dct) if self.cfg.grad_dct else grad
            fake.backward(grad.to(fake.device) / divisor)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()):  # one host sync
            # Never let a non-finite gradient into Adam's moments (they would stay non-finite).
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        self.ema.update(self.model)
        return True

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": portable_adam_state(self.optimizer),
            "rng": self.rng.get_state(),
            "public_warmed": self.public_warmed,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._graph = None  # Adam's state tensors are new: captured again on the next query
        self.rng.set_state(state["rng"])
        self.public_warmed = bool(state.get("public_warmed", True))


def portable_adam_state(optimizer: torch.optim.Optimizer) -> dict:
    """Adam's state dict as an eager Adam keeps it (CPU step counts, not capturable), whether or not
    a CUDA graph made it capturable: a checkpoint resumes on any device, with or without graphs.
    New dicts throughout: ``state_dict()`` shares the live state's."""
    sd = optimizer.state_dict()
    state = {
        k: {**v, "step": torch.as_tensor(v["step"]).detach().cpu()} if "step" in v else v
        for k, v in sd["state"].items()
    }
    groups = [{**g, "capturable": False} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}
