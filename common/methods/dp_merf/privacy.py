"""DP-MERF's privacy: one Gaussian mechanism per client release, its calibration, the honest
release's bound, and the sentences of its privacy statement."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.calibration import ledger_epsilon, smallest_noise
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, per_client_sentence
from common.secagg.plan import release_events

from ..secure_sums import collusion_sentence, secure_rule
from . import secure
from .secure import fewest_survivors

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

    from .features import FeatureFamily

RULE_DP_MERF = (
    "per-client, untrusted server: each client releases its labelled mean embedding once, clipped to "
    "L2 norm S (so sensitivity 2S under replacing the client's whole data), with noise std 2σS per "
    "coordinate: one Gaussian mechanism with noise multiplier σ per release, composed over the client's "
    "own releases without amplification; everything the server computes afterwards is post-processing"
)

RULE_DP_MERF_SECURE = (
    "per-client, server runs the secure sum ({collusion}): each client deposits its labelled mean embedding once, "
    "clipped to S, scaled to integers and conditionally rounded to a fixed norm, plus a Skellam share; "
    "the server sees only sums of at least t clients, which carry Sk(μ) with μ = (σΔ₂)²/2: one Skellam "
    "mechanism per release (Agarwal, Kairouz & Liu 2021, replace-one sensitivities of the rounded vector), "
    "composed over the client's own releases without amplification"
)


def release_noise(cfg: ExperimentConfig) -> float:
    """σ of the release a client makes (what a node's minimum noise is checked against); through a
    secure sum, its own share's: σ/√(t − k) (the t − k honest shares of a sum carry σ)."""
    if cfg.secure_aggregation:
        return cfg.merf_noise_multiplier / math.sqrt(fewest_survivors(cfg) - cfg.secagg_colluders)
    return cfg.merf_noise_multiplier


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["noise multiplier 0 (the summary released without noise)"] if cfg.merf_noise_multiplier == 0 else []


def client_void(cfg: ExperimentConfig) -> str:
    """Why a client's release in this run is not private (""): a fixed noise seed its node allowed."""
    return VOID_NOISE_SEED if cfg.noise_seed >= 0 else ""


def planned_event(cfg: ExperimentConfig, family: FeatureFamily) -> PrivacyEvent:
    """The mechanism one release runs: a Gaussian with noise multiplier σ (sensitivity 2, std 2σ);
    through a secure sum, the revealed sum's Skellam (against a server that runs the protocol)."""
    if cfg.secure_aggregation:
        return release_events(secure.plan(cfg, family), client_void(cfg))[0]
    return PrivacyEvent(noise_multiplier=cfg.merf_noise_multiplier, sample_rate=1.0, void=client_void(cfg))


def calibrate(cfg: ExperimentConfig, family: FeatureFamily, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for ``target_epsilon``: one release per client reaches the target; the target also becomes
    the clients' budget, so a second request is refused."""
    if cfg.secure_aggregation:  # the sum's guarantee against a server that runs the protocol
        sigma = smallest_noise(
            lambda nm: PrivacyLedger([secure.plan(cfg, family, noise_multiplier=nm).protocol_event()]).epsilon(
                delta=cfg.delta
            ),
            cfg.target_epsilon,
        )
    else:
        sigma = smallest_noise(lambda nm: ledger_epsilon(nm, 1.0, 1, cfg.delta), cfg.target_epsilon)
    budget = min(cfg.client_epsilon_budget or cfg.target_epsilon, cfg.target_epsilon)
    return cfg.replace(merf_noise_multiplier=sigma, client_epsilon_budget=budget)


# An honest release's noise exceeds 2σ(√d + TAIL) with probability below exp(-TAIL²/2) ≈ 1e-14.
HONEST_TAIL = 8.0


def honest_norm_bound(cfg: ExperimentConfig, coords: int) -> float:
    """The largest norm an honest release shows except with negligible probability: the clipped
    summary (≤ S) plus noise of std 2σS on each of its ``coords`` coordinates."""
    return cfg.merf_clip * (1.01 + 2 * cfg.merf_noise_multiplier * (math.sqrt(coords) + HONEST_TAIL))


def statement(
    cfg: ExperimentConfig,
    family: FeatureFamily,
    name: str,
    ledgers: Mapping[int, PrivacyLedger],
    *,
    releases_used: int,
) -> str:
    """One noisy summary per client, the generator fitted to their mean on the server (``name``:
    the method's, as the statement names it)."""
    intro = (
        f"Privacy statement (δ = {cfg.delta:g}, {ACCOUNTANT_NAMES[cfg.accountant]}). {name}: each client released "
        f"once the mean over its examples of φ(x) ⊗ onehot(y), where φ is {family.describe(cfg)} "
        f"plus a constant coordinate (‖φ‖ = 1), clipped to L2 "
        f"norm S = {cfg.merf_clip:g}, with noise std 2σS per coordinate (σ = {cfg.merf_noise_multiplier:g}): one "
        "Gaussian mechanism with noise multiplier σ. "
        f"The generator was fitted on the server to the mean of the {releases_used} accepted releases: "
        "post-processing, no further privacy cost."
    )
    rule, collusion = RULE_DP_MERF, ""
    if cfg.secure_aggregation:
        t, k = fewest_survivors(cfg), cfg.secagg_colluders
        intro += (
            f" Secure aggregation: the summaries were never sent; each client deposited its summary with a "
            f"Skellam share of the noise (Sk(μ/{t - k}) per coordinate), and the server saw only SecAgg+ sums over "
            f"cohorts of about {cfg.secagg_cohort} clients, each revealed only if at least {t} inputs were in it. "
            "The per-client ε below holds against a server that runs that protocol; against one that deviates, "
            "only the client's own share protects it (the figure beside it in the report)."
        )
        rule = secure_rule(RULE_DP_MERF_SECURE, k)
        collusion = collusion_sentence(secure.plan(cfg, family), ledgers, cfg.delta)
    per_client, worst = per_client_sentence(ledgers, delta=cfg.delta, accountant=cfg.accountant, what="noisy summaries")
    parts = [intro, per_client, f"Rule: {rule}."] + ([collusion] if collusion else [])
    return assemble(list(ledgers.values()), parts, worst)
