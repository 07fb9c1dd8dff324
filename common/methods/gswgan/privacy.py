"""GS-WGAN's privacy: the mechanism of one answer, its calibration, the honest answer's bounds, and
the sentences of its privacy statement.

One answered query releases B per-sample gradients that all depend on the same private
discriminator, each clipped to C and noised with std 2σC: one Gaussian mechanism with noise
multiplier σ/√B (``planned_event``), composed over the client's own answers without amplification
(the headline); the server's own ledger of its secret sampling gives the amplified figure beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from common.calibration import smallest_noise
from common.channels import ReleaseSpec, channel_for, epsilon_after
from common.privacy import PrivacyEvent, PrivacyLedger, query_noise_multiplier
from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, per_client_sentence, server_sentence

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

RULE_PER_CLIENT = (
    "per-client, untrusted server: each answered query is one Gaussian mechanism with noise "
    "multiplier σ/√B (sensitivity 2C, noise std 2σC, B samples per query), composed over the "
    "client's own queries without amplification"
)
RULE_AMPLIFIED_WOR = (
    "amplified, trusted sampling (an assumption about the server): each generator step the server "
    "draws m of the K_t clients still available uniformly without replacement from a CSPRNG, and "
    "records q_t = m/K_t in its own ledger; subsampled Gaussian without replacement, replace-one "
    "adjacency (Wang, Balle, Kasiviswanathan 2019, Thm. 27) with noise multiplier σ/√B, composed "
    "over the steps that were sent"
)
# An honest row's noise exceeds 2σC(√d + TAIL) with probability below exp(-TAIL²/2) ≈ 1e-14
# (Gaussian norm concentration: ‖ξ‖ ≤ √d + t except with probability exp(-t²/2)).
HONEST_TAIL = 8.0


def coords(cfg: ExperimentConfig) -> int:
    """Coordinates of one sample's gradient as released (DCT coefficients or pixels)."""
    return cfg.grad_dct**2 if cfg.grad_dct else 28 * 28


def release_spec(
    cfg: ExperimentConfig, batch_size: int | None = None, *, noise_multiplier: float | None = None
) -> ReleaseSpec:
    """One answer: B rows of ``coords`` clipped to C each (the answer's norm ≤ C√B), carrying σ/√B
    (or ``noise_multiplier`` per answer); a step asks its m clients (``--clients-per-step``), the
    cohort of a summing channel."""
    B = cfg.batch_size if batch_size is None else batch_size
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=B)
    nm = nm if noise_multiplier is None else noise_multiplier
    void = client_void(cfg)
    return ReleaseSpec(
        what="answer",
        describes="its answer to a query, B per-sample gradients each clipped to C (norm ≤ C√B)",
        dim=B * coords(cfg),
        clip=cfg.clip * math.sqrt(B),
        noise_multiplier=nm,
        cohort=cfg.clients_per_step,
        cohort_field="clients_per_step",
        noise_field="noise_multiplier",
        clear_event=PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=void),
        void=void,
        # each row's Gaussian as the mechanism defines it: std 2σC (for the run's σ)
        noise_std=2.0 * cfg.noise_multiplier * cfg.clip if noise_multiplier is None else None,
    )


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    """Its debugging options that void a node's guarantee."""
    out = ["un-noised critic statistics (client-stats)"] if cfg.client_stats else []
    return out + (["noise multiplier 0 (gradients released without noise)"] if cfg.noise_multiplier == 0 else [])


def client_void(cfg: ExperimentConfig) -> str:
    """Why a client's answers in this run are not private (""): what the node's policy allowed."""
    if cfg.noise_seed >= 0:
        return VOID_NOISE_SEED
    return VOID_CLIENT_STATS if cfg.client_stats else ""


def planned_event(cfg: ExperimentConfig, batch_size: int) -> PrivacyEvent:
    """The mechanism one answer runs, as the run's channel records it: in the clear a Gaussian with
    noise multiplier sigma/sqrt(B), void when the run uses a non-private option its nodes allowed."""
    return channel_for(cfg).events(cfg, release_spec(cfg, batch_size))[0]


def answers_per_client(cfg: ExperimentConfig) -> int:
    """Each client's expected share of the queries, ceil(T·m/K) (at least 1): what the calibration
    gives every client the budget for."""
    return max(math.ceil(cfg.steps * cfg.clients_per_step / len(cfg.participants())), 1)


def calibrate(
    cfg: ExperimentConfig, *, pooled_size: int | None = None, prior: Sequence[PrivacyEvent] = ()
) -> ExperimentConfig:
    """σ for ``target_epsilon``: the per-client ε of a client answering its expected share
    ceil(T·m/K) of queries, after its ``prior`` releases (a seed release), reaches the target; the
    target also becomes the clients' budget, so one sampled more often than expected refuses
    instead of exceeding it."""
    target = cfg.target_epsilon
    queries = answers_per_client(cfg)
    channel = channel_for(cfg)
    per_query = smallest_noise(
        lambda nm: epsilon_after(channel, cfg, release_spec(cfg, noise_multiplier=nm), queries, prior), target
    )
    budget = min(cfg.client_epsilon_budget or target, target)
    return cfg.replace(noise_multiplier=per_query * math.sqrt(cfg.batch_size), client_epsilon_budget=budget)


def unspent_answers_note(cfg: ExperimentConfig) -> str:
    """The answers the calibrated budget allows but the schedule never asks for, and the --steps
    that asks for them all at the same σ; empty when the schedule spends them (or nothing was
    calibrated). Each client's budget is ceil(T·m/K) answers and no amplification is claimed, so
    a run with T·m < K·ceil(T·m/K) pays that σ for fewer answers than it could have had: measured on
    Fashion-MNIST with secure sums, the seeded runs of 200 steps × 8 of K = 3,000 asked 1,600 of 3,000.
    The same answers can also go to more clients per step over the same steps: each step's sum then
    carries more clipped gradients under the same noise per answer, the lever where B is small: measured
    at K = 27,500 clients of 2 images (per-client ε 1, one seed), 64 a step kept the seed (quick CNN 73.1%
    against its 73.8%, domain FID 21.6 against 15.5) where 8 a step lost it (69.2%, 87.0)."""
    if cfg.target_epsilon <= 0:
        return ""
    clients, m, steps, queries = len(cfg.participants()), cfg.clients_per_step, cfg.steps, answers_per_client(cfg)
    full = queries * clients // m  # ceil(full·m/K) = queries again: the same σ
    if steps >= full:
        return ""
    wide = min(queries * clients // steps, clients)  # m over the same T steps, when that also keeps the σ
    wider = (
        f", as would --clients-per-step {wide} over these {steps} steps (each step's sum then carries {wide / m:.3g}x "
        "the clipped gradients)"
        if wide > m and answers_per_client(cfg.replace(clients_per_step=wide)) == queries
        else ""
    )
    return (
        f"--steps {steps} x --clients-per-step {m} asks for {steps * m:,} answers, but the calibrated noise gives "
        f"each of the {clients:,} clients a budget of {queries} (ceil(T·m/K)), {queries * clients:,} in all: "
        f"--steps {full} would ask for them all at the same noise and the same per-client ε{wider}"
    )


def honest_norm_bound(cfg: ExperimentConfig, noise_scale: float = 1.0) -> float:
    """The largest per-sample norm an honest answer shows except with negligible probability: the
    clipped gradient (≤ C) plus noise of std 2σC on each of its d coordinates (times ``noise_scale``:
    the run's channel's noise over the method's own)."""
    d = coords(cfg)
    sigma = cfg.noise_multiplier * noise_scale
    return cfg.clip * (1.01 + 2 * sigma * (math.sqrt(d) + HONEST_TAIL))  # 1%: float16 rounding


def implausible_norms(grad: np.ndarray, cfg: ExperimentConfig, noise_scale: float = 1.0) -> str:
    """Why an answer cannot be honest (a row above ``honest_norm_bound``), or "": such an answer
    would move G by what a hostile client chose (1e30 once saturated Adam's moments for good)."""
    norms = np.sqrt(np.square(grad.reshape(grad.shape[0], -1), dtype=np.float64).sum(axis=1))
    bound = honest_norm_bound(cfg, noise_scale)
    if not np.all(norms <= bound):
        worst = float(np.max(norms))
        return f"a per-sample norm of {worst:.3g} exceeds {bound:.3g}, what clipping to C plus the noise allows"
    return ""


# --- the statement ---------------------------------------------------------------------------------
def _released_sentences(cfg: ExperimentConfig) -> list[str]:
    """What one answer releases, and what a client keeps (its options named, because a reader asks
    whether they cost privacy: they do not)."""
    sigma, B, k = cfg.noise_multiplier, cfg.batch_size, cfg.grad_dct
    coords = f"as its {k}x{k} lowest 2-D DCT coefficients (a fixed public basis), " if k else ""
    intro = (
        f"Privacy statement (δ = {cfg.delta:g}, {ACCOUNTANT_NAMES[cfg.accountant]}). Each answered query releases "
        f"B = {B} noisy per-sample generator gradients ({coords}each clipped to norm C, noise std 2σC "
        f"with σ = {sigma:g}): one Gaussian mechanism with noise multiplier σ/√B = {sigma / math.sqrt(B):.4g}."
    )
    warm = f", its non-private warm start ({cfg.warmup_steps} iterations on its own data)" if cfg.warmup_steps else ""
    dpac = (
        f" DPAC (β = {cfg.dpac_beta:g}): each released per-sample gradient is that of β·(WGAN term) + (1−β)·(the "
        "cross-entropy of the client's own auxiliary classifier), clipped and noised once as above; the "
        "classifier, trained on the client's data, is never released either."
        if cfg.dpac_beta < 1
        else ""
    )
    unreleased = (
        f"A client's discriminator{warm} and its critic steps are never released and cost no privacy: "
        f"everything derived from its data reaches the server only through these sanitized answers.{dpac}"
    )
    return [intro, unreleased]


def _amplified_sentence(server: PrivacyLedger, worst: float | None, *, delta: float, accountant: str) -> str:
    amplified = server_sentence(
        server,
        delta=delta,
        accountant=accountant,
        lead="Amplified guarantee (secondary; assumes the server's sampling is secret "
        "and uniform, which a client cannot verify)",
    )
    amp_eps = server.headline(delta=delta, accountant=accountant)[0] if server.queries else 0.0
    if worst is not None and math.isfinite(amp_eps) and amp_eps > worst:
        amplified += (
            " Amplification does not help at this noise level: this bound is above the per-client ε, "
            "which holds with a trusted server too."
        )
    return amplified


def statement(cfg: ExperimentConfig, ledgers: Mapping[int, PrivacyLedger], server: PrivacyLedger) -> str:
    """The per-client headline from the clients' ledgers, the amplified figure from the server's
    record of its sampling. Releases before the run that its ledgers include (a seed stage, the
    debugging task's selection query) are named by ``MethodBase.privacy_report``."""
    delta, accountant = cfg.delta, cfg.accountant
    per_client, worst = per_client_sentence(ledgers, delta=delta, accountant=accountant, what="answered queries")
    channel, spec = channel_for(cfg), release_spec(cfg)
    how, *after = channel.sentences(cfg, spec, ledgers) or [""]
    rule = channel.rule(cfg, spec, RULE_PER_CLIENT)
    head = [*_released_sentences(cfg), *([how] if how else []), per_client, f"Rule: {rule}.", *after]
    if channel.sums:  # a summing channel draws least-used first, no secret sample: no amplified figure
        return assemble(list(ledgers.values()), head, worst)
    amplified = _amplified_sentence(server, worst, delta=delta, accountant=accountant)
    parts = [*head, amplified, f"Rule: {RULE_AMPLIFIED_WOR}."]
    # NOT PRIVATE is about the headline: a void server ledger (reproducible sampling) voids only the
    # amplified figure, and its sentence says so.
    return assemble(list(ledgers.values()), parts, worst)
