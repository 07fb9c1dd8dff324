"""GS-WGAN's privacy: the mechanism of one answer, its calibration, the honest answer's bounds, and
the sentences of its privacy statement.

One answered query releases B per-sample gradients that all depend on the same private
discriminator, each clipped to C and noised with std 2σC: one Gaussian mechanism with noise
multiplier σ/√B (``planned_event``), composed over the client's own answers without amplification
(the headline); the server's own ledger of its secret sampling gives the amplified figure beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from common.calibration import ledger_epsilon, smallest_noise
from common.privacy import PrivacyEvent, PrivacyLedger, query_noise_multiplier
from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, per_client_sentence, server_sentence
from common.secagg.plan import fewest_survivors, release_events

from ..secure_sums import collusion_sentence, secure_rule
from .secure_plan import plan

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

RULE_PER_CLIENT = (
    "per-client, untrusted server: each answered query is one Gaussian mechanism with noise "
    "multiplier σ/√B (sensitivity 2C, noise std 2σC, B samples per query), composed over the "
    "client's own queries without amplification"
)
RULE_PER_CLIENT_SECURE = (
    "per-client, server runs the secure sum ({collusion}): each answered query is one Skellam mechanism on the sum of "
    "the step's answers (Agarwal, Kairouz & Liu 2021; replace-one sensitivities of the client's rounded "
    "answer, norm ≤ C√B before rounding), noise multiplier σ/√B in the Gaussian's units, composed over the "
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


def release_noise(cfg: ExperimentConfig) -> float:
    """The noise multiplier of each answer as the mechanism runs, σ/√B (what a node's minimum noise
    is checked against: the server picks B, so σ alone would not bound it); through a secure sum, the
    node's own share's, σ/√(B·(t − k))."""
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=cfg.batch_size)
    if cfg.secure_aggregation:
        return nm / math.sqrt(secure_survivors(cfg) - cfg.secagg_colluders)
    return nm


def secure_survivors(cfg: ExperimentConfig) -> int:
    """t of a step's secure sum over its m clients (``--secagg-threshold``, or ⌈2m/3⌉)."""
    return fewest_survivors(cfg.clients_per_step, cfg.secagg_threshold)


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
    """The mechanism one answer runs, as it will be recorded: a Gaussian with noise multiplier
    sigma/sqrt(B), void when the run uses a non-private option its nodes allowed."""
    nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=batch_size)
    if cfg.secure_aggregation:  # the step's sum, against a server that runs the protocol
        return release_events(plan(cfg), client_void(cfg))[0]
    return PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=client_void(cfg))


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for ``target_epsilon``: the per-client ε of a client answering its expected share
    ceil(T·m/K) of queries reaches the target; the target also becomes the clients' budget, so one
    sampled more often than expected refuses instead of exceeding it."""
    target = cfg.target_epsilon
    queries = math.ceil(cfg.steps * cfg.clients_per_step / len(cfg.participants()))
    if cfg.secure_aggregation:  # the sums' Skellam, against a server that runs the protocol

        def epsilon(nm: float) -> float:
            return PrivacyLedger([plan(cfg, noise_multiplier=nm).protocol_event(max(queries, 1))]).epsilon(
                delta=cfg.delta
            )

        per_query = smallest_noise(epsilon, target)
    else:
        per_query = smallest_noise(lambda nm: ledger_epsilon(nm, 1.0, max(queries, 1), cfg.delta), target)
    budget = min(cfg.client_epsilon_budget or target, target)
    return cfg.replace(noise_multiplier=per_query * math.sqrt(cfg.batch_size), client_epsilon_budget=budget)


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


def statement(
    cfg: ExperimentConfig, ledgers: Mapping[int, PrivacyLedger], server: PrivacyLedger, *, prior: str = ""
) -> str:
    """The per-client headline from the clients' ledgers, the amplified figure from the server's
    record of its sampling. ``prior`` describes releases made before this run that its ledgers
    include (the debugging task's selection query)."""
    delta, accountant = cfg.delta, cfg.accountant
    per_client, worst = per_client_sentence(ledgers, delta=delta, accountant=accountant, what="answered queries")
    if cfg.secure_aggregation:
        t, k = secure_survivors(cfg), cfg.secagg_colluders
        secure = (
            f"Secure aggregation: the {cfg.clients_per_step} clients of a step answered the same fake batch and "
            f"never sent their answers: each deposited its clipped gradients, scaled to integers and rounded to a "
            f"fixed norm, with a Skellam share of the noise (Sk(μ/{t - k})), and the server saw only the SecAgg+ sum "
            f"of at least {t} answers, which carries Sk(μ), noise multiplier σ/√B. The per-client ε below holds "
            "against a server that runs that protocol; against one that deviates only a client's own share protects "
            "it (the figure beside it in the report). No amplification by sampling is claimed."
        )
        rule = secure_rule(RULE_PER_CLIENT_SECURE, k)
        parts = [*_released_sentences(cfg), secure, per_client, f"Rule: {rule}."]
        parts += [collusion_sentence(plan(cfg), ledgers, delta)] + ([prior] if prior else [])
        return assemble(list(ledgers.values()), parts, worst)
    amplified = _amplified_sentence(server, worst, delta=delta, accountant=accountant)
    parts = [*_released_sentences(cfg), per_client, f"Rule: {RULE_PER_CLIENT}."]
    parts += [amplified, f"Rule: {RULE_AMPLIFIED_WOR}."] + ([prior] if prior else [])
    # NOT PRIVATE is about the headline: a void server ledger (reproducible sampling) voids only the
    # amplified figure, and its sentence says so.
    return assemble(list(ledgers.values()), parts, worst)
