"""Fed-Avg GAN's privacy: what each raw delta costs a client, the calibration of z, and the
sentences of its privacy statement (unbounded per client against the server; user-level with a
trusted one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.calibration import subsampled_noise
from common.channels import ReleaseSpec, channel_for
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_RAW_DELTA
from common.privacy.statement import (
    ACCOUNTANT_NAMES,
    assemble,
    finite_or_none,
    per_client_sentence,
    server_sentence,
)

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

RAW_DELTA = PrivacyEvent(noise_multiplier=0.0, void=VOID_RAW_DELTA)  # what each delta sent costs a client
RULE_FEDAVG_USER = (
    "user-level DP-FedAvg, trusted server (an assumption about the server): each round every client "
    "is sampled independently with probability q = m/K from a CSPRNG, each sampled client's whole "
    "discriminator delta is clipped to S, N(0, (zS)^2) is added to the sum, which is divided by the "
    "fixed m; Poisson-subsampled Gaussian (add/remove adjacency) with noise multiplier z over the "
    "rounds that ran"
)
RULE_FEDAVG_UNTRUSTED = (
    "per-client, untrusted server: unbounded, each sampled client sends its raw discriminator delta "
    "to the server (see epsilon_amplified for the trusted-server figure)"
)


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return []


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """z for the user-level, trusted-server ε of the rounds (Poisson, q = m/K); per-client ε
    against the server stays unbounded whatever the noise, which the report says."""
    q = min(1.0, cfg.fedavg_clients_per_round / len(cfg.participants()))
    return cfg.replace(fedavg_noise_multiplier=subsampled_noise(cfg.target_epsilon, q, cfg.steps, cfg.delta))


def statement(
    cfg: ExperimentConfig, ledgers: Mapping[int, PrivacyLedger], server: PrivacyLedger, spec: ReleaseSpec
) -> str:
    """Unbounded per client against the server; user-level with a trusted server (through a channel
    that bounds every release, a secure sum: per client, the channel's words and rule)."""
    delta, accountant = cfg.delta, cfg.accountant
    channel = channel_for(cfg)
    if channel.bounds_every_release:
        intro = (
            f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Fed-Avg GAN: each round "
            f"{cfg.fedavg_clients_per_round} clients ran their local steps on the received discriminator and "
            f"released its delta, clipped to S = {cfg.fedavg_clip:g} on their nodes, through the {channel.name} "
            f"channel, noise multiplier z = {cfg.fedavg_noise_multiplier:g}."
        )
        how, *after = channel.sentences(cfg, spec, ledgers) or [""]
        per_client, worst = per_client_sentence(ledgers, delta=delta, accountant=accountant, what="deltas released")
        rule = channel.rule(cfg, spec, RULE_FEDAVG_UNTRUSTED)
        parts = [intro + (f" {how}" if how else ""), per_client, f"Rule: {rule}.", *after]
        return assemble(list(ledgers.values()), parts, worst)
    intro = (
        f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Fed-Avg GAN, user-level "
        f"DP-FedAvg: each round every sampled client's discriminator delta is clipped to L2 norm "
        f"S = {cfg.fedavg_clip:g} and the server adds Gaussian noise of std zS (z = {cfg.fedavg_noise_multiplier:g}) "
        "to their sum."
    )
    per_client, _ = per_client_sentence(ledgers, delta=delta, accountant=accountant, what="raw deltas sent")
    user = server_sentence(
        server,
        delta=delta,
        accountant=accountant,
        lead="With a trusted server that samples secretly and adds the noise, user-level",
    )
    server_eps = server.headline(delta=delta, accountant=accountant)[0] if server.queries else 0.0
    parts = [intro, per_client, f"Rule: {RULE_FEDAVG_UNTRUSTED}.", user, f"Rule: {RULE_FEDAVG_USER}."]
    # The clients' void marks (raw deltas) are the method, not a debugging option: only the
    # server's record decides whether the trusted-server figure is NOT PRIVATE.
    return assemble([server], parts, finite_or_none(server_eps))
