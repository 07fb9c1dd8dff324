"""DP-MERF's privacy: its release as the run's channel sees it (``release_spec``), the calibration,
the honest release's bound, and the sentences of its privacy statement. In the clear each release
is one Gaussian mechanism; through another channel (a secure sum) the channel's events, rule and
sentences take its place."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from common.calibration import smallest_noise
from common.channels import ReleaseSpec, channel_for, epsilon_after
from common.data import num_classes_for
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, per_client_sentence
from common.secagg.plan import fewest_survivors

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

    from .features import FeatureFamily

RULE_DP_MERF = (
    "per-client, untrusted server: each client releases its labelled mean embedding once, clipped to "
    "L2 norm S (so sensitivity 2S under replacing the client's whole data), with noise std 2σS per "
    "coordinate: one Gaussian mechanism with noise multiplier σ per release, composed over the client's "
    "own releases without amplification; everything the server computes afterwards is post-processing"
)


def release_spec(cfg: ExperimentConfig, family: FeatureFamily, *, noise_multiplier: float | None = None) -> ReleaseSpec:
    """One client's release: its labelled mean embedding, d = C·(a row of the family's features)
    coordinates clipped to S, carrying σ (the run's, or ``noise_multiplier``); a summing channel's
    cohorts are ``--secagg-cohort`` clients (c to 2c − 1)."""
    sigma = cfg.merf_noise_multiplier if noise_multiplier is None else noise_multiplier
    void = client_void(cfg)
    return ReleaseSpec(
        what="summary",
        describes="its labelled mean embedding once, clipped to S",
        dim=num_classes_for(cfg) * family.row_dim(cfg),
        clip=cfg.merf_clip,
        noise_multiplier=sigma,
        cohort=cfg.secagg_cohort,
        cohort_field="secagg_cohort",
        noise_field="merf_noise_multiplier",
        clear_event=PrivacyEvent(noise_multiplier=sigma, sample_rate=1.0, void=void),
        void=void,
    )


def cohort_noise_note(cfg: ExperimentConfig, family: FeatureFamily) -> str:
    """How much noise the secure sums' cohorts put on the mean the generator fits, when one sum of
    all clients would put much less; empty otherwise (in the clear, one cohort, or a fixed t). Each
    client's share carries the channel's ``node_noise`` (σ/√(t − k), t from ``--secagg-cohort``), so K
    clients leave the mean K·(share/σ)² releases' worth of noise: measured on Fashion-MNIST at ε 1,
    K = 3,000 in sums of 1,000 put noise of norm 0.184 on a mean of norm 0.184 (bench/release_noise.py)."""
    channel, clients, c = channel_for(cfg), len(cfg.participants()), cfg.secagg_cohort
    spec = release_spec(cfg, family)
    if not channel.sums or clients // c <= 1 or cfg.secagg_threshold or not spec.noise_multiplier:
        return ""
    split, whole = (
        clients * (channel.node_noise(cfg, s) / s.noise_multiplier) ** 2 for s in (spec, replace(spec, cohort=clients))
    )
    ratio = math.sqrt(whole / split)
    if ratio > 0.8:
        return ""
    return (
        f"--secagg-cohort {c} splits the {clients:,} clients into {clients // c} sums whose noise shares are "
        f"calibrated for t = {fewest_survivors(c, 0)}: the mean the generator fits carries {split:.1f} releases' "
        f"worth of noise; one sum of all of them (--secagg-cohort {clients}) would carry {whole:.1f}, "
        f"{ratio:.2f}x the noise's std at the same per-client ε, for one larger sum (SecAgg+'s work grows with "
        "the clients times the graph's degree; a sum that aborts loses every release in it)"
    )


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["noise multiplier 0 (the summary released without noise)"] if cfg.merf_noise_multiplier == 0 else []


def client_void(cfg: ExperimentConfig) -> str:
    """Why a client's release in this run is not private (""): a fixed noise seed its node allowed."""
    return VOID_NOISE_SEED if cfg.noise_seed >= 0 else ""


def planned_event(cfg: ExperimentConfig, family: FeatureFamily) -> PrivacyEvent:
    """The mechanism one release runs, as the run's channel charges it: in the clear a Gaussian with
    noise multiplier σ (sensitivity 2, std 2σ); through a secure sum, the revealed sum's Skellam."""
    return channel_for(cfg).events(cfg, release_spec(cfg, family))[0]


def calibrate(
    cfg: ExperimentConfig,
    family: FeatureFamily,
    *,
    pooled_size: int | None = None,
    prior: Sequence[PrivacyEvent] = (),
) -> ExperimentConfig:
    """σ for ``target_epsilon``: one release per client, after its ``prior`` ones, reaches the target
    (through the run's channel); the target also becomes the clients' budget, so a second request
    is refused."""
    channel = channel_for(cfg)
    sigma = smallest_noise(
        lambda nm: epsilon_after(channel, cfg, release_spec(cfg, family, noise_multiplier=nm), 1, prior),
        cfg.target_epsilon,
    )
    budget = min(cfg.client_epsilon_budget or cfg.target_epsilon, cfg.target_epsilon)
    return cfg.replace(merf_noise_multiplier=sigma, client_epsilon_budget=budget)


# An honest release's noise exceeds 2σ(√d + TAIL) with probability below exp(-TAIL²/2) ≈ 1e-14.
HONEST_TAIL = 8.0


def honest_norm_bound(cfg: ExperimentConfig, coords: int, noise_scale: float = 1.0) -> float:
    """The largest norm an honest release shows except with negligible probability: the clipped
    summary (≤ S) plus noise of std 2σS on each of its ``coords`` coordinates (times ``noise_scale``:
    the run's channel's noise over the method's own)."""
    sigma = cfg.merf_noise_multiplier * noise_scale
    return cfg.merf_clip * (1.01 + 2 * sigma * (math.sqrt(coords) + HONEST_TAIL))


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
    channel, spec = channel_for(cfg), release_spec(cfg, family)
    how, *after = channel.sentences(cfg, spec, ledgers) or [""]
    rule = channel.rule(cfg, spec, RULE_DP_MERF)
    per_client, worst = per_client_sentence(ledgers, delta=cfg.delta, accountant=cfg.accountant, what="noisy summaries")
    parts = [intro + (f" {how}" if how else ""), per_client, f"Rule: {rule}.", *after]
    return assemble(list(ledgers.values()), parts, worst)
