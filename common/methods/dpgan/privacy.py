"""Centralized DPGAN's privacy: example-level ε with a trusted curator, its calibration, and the
sentences of its privacy statement."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from common.calibration import smallest_noise, subsampled_noise
from common.learning.dpac import REAL_DATA_MODES
from common.options import check
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, client_entry, fmt_epsilon

from ..seeding import seeded
from ..seeding.pooled import RULE_POOLED_SEED

if TYPE_CHECKING:
    from collections.abc import Sequence

    from common.methods import ExperimentConfig

RULE_DPGAN = (
    "example-level, trusted curator: DP-SGD on the discriminator (Opacus; Poisson sampling q = B/N "
    "from a CSPRNG, per-example clipping of real and fake rows to C, noise σC), composed over the "
    "DP steps that ran (the discriminator's, and DPAC's classifier's on real data when it is on); "
    "generator steps are post-processing"
)


def release_noise(cfg: ExperimentConfig) -> float:
    """The smallest noise of its releases, for a node's minimum: the DP-SGD steps' σ, and a seeded
    run's seed release's σ_s (calibrated: before the calibration it has none yet)."""
    seed = cfg.init_noise_multiplier if seeded(cfg) and cfg.init_noise_multiplier > 0 else float("inf")
    return min(cfg.dpgan_noise_multiplier, seed)


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["reproducible DP-SGD batches (sampling-seed, testing only)"] if cfg.sampling_seed >= 0 else []


def calibrate(
    cfg: ExperimentConfig, *, pooled_size: int | None = None, prior: Sequence[PrivacyEvent] = ()
) -> ExperimentConfig:
    """σ for the example-level ε of steps × n_D Poisson-subsampled DP-SGD steps (q = B/N), composed
    after ``prior`` (the curator's seed release, example-level: ``seeding/pooled.py``); the target
    also becomes the curator's budget."""
    if pooled_size is None:
        raise ValueError("calibrating dpgan needs the pooled data size N")
    target = cfg.target_epsilon
    q = min(1.0, cfg.dpgan_batch_size / pooled_size)
    steps = cfg.steps * cfg.dpgan_n_d + classifier_dp_steps(cfg, cfg.steps)
    sigma = subsampled_noise(target, q, steps, cfg.delta)
    if prior:
        sigma = composed_noise(target, q, steps, cfg.delta, prior, alone=sigma)
    return cfg.replace(
        dpgan_noise_multiplier=sigma, client_epsilon_budget=min(cfg.client_epsilon_budget or target, target)
    )


def composed_noise(
    target: float, q: float, steps: int, delta: float, prior: Sequence[PrivacyEvent], *, alone: float
) -> float:
    """The smallest σ whose DP-SGD steps, after ``prior``, keep ε ≤ target: at least ``alone`` (the σ
    without them), searched upwards from it on the ledger's own accountant."""
    before = [replace(e, void="") for e in prior]  # a debugging void changes no noise

    def epsilon_of(sigma: float) -> float:
        sampling = "poisson" if q < 1 else "none"
        event = PrivacyEvent(noise_multiplier=sigma, sample_rate=q, count=steps, sampling=sampling)
        return PrivacyLedger([*before, event]).epsilon(delta=delta) or float("inf")

    high = alone
    while epsilon_of(high) > target:
        high *= 2.0
        if high > 1e4:
            raise ValueError(f"target ε={target} is out of reach after the seed release's share")
    return smallest_noise(epsilon_of, target, low=alone, high=high, rel=1e-3) if high > alone else alone


def check_sizes(cfg: ExperimentConfig, sizes: list[int]) -> None:
    """The curator pools every partition: its expected batch B must not exceed the pooled N (q = B/N
    would exceed 1, and each step would process the whole data set several times over)."""
    check(
        cfg.dpgan_batch_size <= sum(sizes),
        "dpgan_batch_size",
        cfg.dpgan_batch_size,
        f"larger than the pooled data ({sum(sizes)} examples)",
    )


def classifier_dp_steps(cfg: ExperimentConfig, rounds: int) -> int:
    """DP-SGD steps DPAC's classifier takes in ``rounds`` rounds: its init, then one per round
    unless it learns from generated data only (those steps are free)."""
    if cfg.dpac_beta >= 1:
        return 0
    return cfg.dpac_init + rounds * classifier_round_steps(cfg)


def classifier_round_steps(cfg: ExperimentConfig) -> int:
    """DP-SGD steps of DPAC's classifier per round after its init: one unless it learns from
    generated data only."""
    return 1 if cfg.dpac_beta < 1 and cfg.dpac_train in REAL_DATA_MODES else 0


def grouping_sentence(cfg: ExperimentConfig) -> str:
    """The privacy statement's sentence on grouped clipping (empty without grouping)."""
    if cfg.dpgan_clip_groups == "none":
        return ""
    bounds = "estimated on public data" if cfg.dpgan_group_bounds == "public" else "equal"
    return (
        f"D's per-example gradients are clipped per parameter group ({cfg.dpgan_clip_groups}, {bounds} bounds C_j "
        f"with √Σ C_j² = {cfg.dpgan_clip:g}, the sensitivity), and the noise is {cfg.dpgan_group_noise}: one "
        "Gaussian mechanism with the same σ, so ε is that of flat clipping."
    )


def statement(cfg: ExperimentConfig, ledger: PrivacyLedger) -> str:
    """One curator ledger, example-level (with DPAC, C's DP steps are in it)."""
    entry = client_entry(0, ledger, delta=cfg.delta, accountant=cfg.accountant)
    last = ledger.history[-1] if ledger.history else None
    dp_steps = ledger.queries - (1 if seeded(cfg) and ledger.history else 0)  # the seed release is no step
    eps, beta, grouping = entry["epsilon"], cfg.dpac_beta, grouping_sentence(cfg)
    body = (
        f"Privacy statement (δ = {cfg.delta:g}, {ACCOUNTANT_NAMES[cfg.accountant]}). Centralized DPGAN: every "
        f"training example is protected at ε = {fmt_epsilon(eps)}"
        + (f" ({entry['epsilon_reason']})" if entry["epsilon_reason"] else "")
        + f" by {'the seed release below and ' if dp_steps < ledger.queries else ''}DP-SGD on the discriminator "
        f"over {dp_steps} noisy steps"
        + (
            f" (DPAC, β = {beta:g}: these include its auxiliary classifier's DP-SGD steps on real data, "
            "at the same σ and q; its steps on generated data are post-processing)"
            if beta < 1
            else ""
        )
        + (f" (σ = {last.noise_multiplier:g}, q = {last.sample_rate:.4g})" if last else "")
        + ". This assumes the curator node that pools the data is trusted."
        + (f" {grouping}" if grouping else "")
        + seed_sentence(cfg, ledger)
    )
    return assemble([ledger], [body, f"Rule: {rule(cfg)}."], eps)


def seed_round_note(cfg: ExperimentConfig) -> str:
    """A seeded run's first round holds the seed release and the curator's whole fit of G to it
    (``init_steps`` steps): long enough for a Flower transport's reply timeout to take the curator
    for dead (measured on Fashion-MNIST, 500 features, 16 samples a class, the small model, two runs
    on these 2 cores: 4,000 steps in about 770 s, 0.19 s a step)."""
    if not seeded(cfg):
        return ""
    critic = " (its D starts from scratch: --init-critic-steps is unused)" if cfg.init_critic_steps else ""
    return (
        f"the curator's first round makes the seed release and fits G to it for --init-steps {cfg.init_steps} "
        f"steps before its DP-SGD steps{critic}; over Flower the server waits --reply-timeout-s "
        f"{cfg.reply_timeout_s:g} s for it, so raise that to cover the fit"
    )


def rule(cfg: ExperimentConfig) -> str:
    """The headline's rule: DP-SGD's, after the curator's seed release when the run has one."""
    return f"{RULE_POOLED_SEED}; then {RULE_DPGAN}" if seeded(cfg) else RULE_DPGAN


def seed_sentence(cfg: ExperimentConfig, ledger: PrivacyLedger) -> str:
    """The statement's sentence on the curator's seed release (empty without one)."""
    if not seeded(cfg) or not ledger.history:
        return ""
    seed = PrivacyLedger(ledger.history[:1]).epsilon(delta=cfg.delta)
    return (
        f" Before its first DP-SGD step the curator released once ({cfg.init_release}'s summary, at example level) "
        "the sum over the pooled data of φ(x) ⊗ onehot(y) with ‖φ‖ = 1, so adding or removing one example moves "
        f"it by at most 1, with Gaussian noise of std σ_s = {cfg.init_noise_multiplier:.4g} per coordinate: one "
        f"Gaussian mechanism (ε {fmt_epsilon(seed)} alone), the first entry of the same ledger. G was fitted to "
        f"that release and kept fitting it (weight {cfg.init_weight:g}) beside D's loss: post-processing."
    )
