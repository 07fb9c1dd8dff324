"""Centralized DPGAN's privacy: example-level ε with a trusted curator, its calibration, and the
sentences of its privacy statement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.calibration import subsampled_noise
from common.learning.dpac import REAL_DATA_MODES
from common.options import check
from common.privacy import PrivacyLedger
from common.privacy.statement import ACCOUNTANT_NAMES, assemble, client_entry, fmt_epsilon

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

RULE_DPGAN = (
    "example-level, trusted curator: DP-SGD on the discriminator (Opacus; Poisson sampling q = B/N "
    "from a CSPRNG, per-example clipping of real and fake rows to C, noise σC), composed over the "
    "DP steps that ran (the discriminator's, and DPAC's classifier's on real data when it is on); "
    "generator steps are post-processing"
)


def release_noise(cfg: ExperimentConfig) -> float:
    return cfg.dpgan_noise_multiplier


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return ["reproducible DP-SGD batches (sampling-seed, testing only)"] if cfg.sampling_seed >= 0 else []


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """σ for the example-level ε of steps × n_D Poisson-subsampled DP-SGD steps (q = B/N); the
    target also becomes the curator's budget."""
    if pooled_size is None:
        raise ValueError("calibrating dpgan needs the pooled data size N")
    target = cfg.target_epsilon
    q = min(1.0, cfg.dpgan_batch_size / pooled_size)
    sigma = subsampled_noise(target, q, cfg.steps * cfg.dpgan_n_d + classifier_dp_steps(cfg, cfg.steps), cfg.delta)
    return cfg.replace(
        dpgan_noise_multiplier=sigma, client_epsilon_budget=min(cfg.client_epsilon_budget or target, target)
    )


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
    eps, beta, grouping = entry["epsilon"], cfg.dpac_beta, grouping_sentence(cfg)
    body = (
        f"Privacy statement (δ = {cfg.delta:g}, {ACCOUNTANT_NAMES[cfg.accountant]}). Centralized DPGAN: every "
        f"training example is protected at ε = {fmt_epsilon(eps)}"
        + (f" ({entry['epsilon_reason']})" if entry["epsilon_reason"] else "")
        + f" by DP-SGD on the discriminator over {ledger.queries} noisy steps"
        + (
            f" (DPAC, β = {beta:g}: these include its auxiliary classifier's DP-SGD steps on real data, "
            "at the same σ and q; its steps on generated data are post-processing)"
            if beta < 1
            else ""
        )
        + (f" (σ = {last.noise_multiplier:g}, q = {last.sample_rate:.4g})" if last else "")
        + ". This assumes the curator node that pools the data is trusted."
        + (f" {grouping}" if grouping else "")
    )
    return assemble([ledger], [body, f"Rule: {RULE_DPGAN}."], eps)
