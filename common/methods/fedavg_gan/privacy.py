"""Fed-Avg GAN's privacy: what each raw delta costs a client, the calibration of z, and the
sentences of its privacy statement (unbounded per client against the server; user-level with a
trusted one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.calibration import subsampled_noise
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_RAW_DELTA
from common.privacy.statement import (
    ACCOUNTANT_NAMES,
    assemble,
    finite_or_none,
    per_client_sentence,
    server_sentence,
)

from ..secure_sums import collusion_sentence, secure_rule

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
RULE_FEDAVG_SECURE = (
    "per-client, server runs the secure sum ({collusion}): each round m clients are drawn uniformly, each clips its "
    "discriminator delta to S on its node and deposits it, rounded to a fixed norm, with a Skellam share; "
    "the server sees only the sum of at least t deltas, which carries Sk(μ), noise multiplier z in the "
    "Gaussian's units (Agarwal, Kairouz & Liu 2021): one Skellam mechanism per round a client takes part "
    "in, composed without amplification"
)
RULE_FEDAVG_UNTRUSTED = (
    "per-client, untrusted server: unbounded, each sampled client sends its raw discriminator delta "
    "to the server (see epsilon_amplified for the trusted-server figure)"
)


def release_noise(cfg: ExperimentConfig) -> float:
    """A client adds no noise: the server does (its ``fedavg_noise_multiplier``), so 0, below any
    node minimum; a node sends raw deltas only when its policy trusts the server."""
    return 0.0


def nonprivate_options(cfg: ExperimentConfig) -> list[str]:
    return []


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """z for the user-level, trusted-server ε of the rounds (Poisson, q = m/K); per-client ε
    against the server stays unbounded whatever the noise, which the report says."""
    q = min(1.0, cfg.fedavg_clients_per_round / len(cfg.participants()))
    return cfg.replace(fedavg_noise_multiplier=subsampled_noise(cfg.target_epsilon, q, cfg.steps, cfg.delta))


def statement(cfg: ExperimentConfig, ledgers: Mapping[int, PrivacyLedger], server: PrivacyLedger) -> str:
    """Unbounded per client against the server; user-level with a trusted server (secure sums: per
    client against a server that runs the protocol)."""
    delta, accountant = cfg.delta, cfg.accountant
    if cfg.secure_aggregation:
        intro = (
            f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Fed-Avg GAN through secure sums: "
            f"each round {cfg.fedavg_clients_per_round} clients clipped their discriminator deltas to S = "
            f"{cfg.fedavg_clip:g} on their nodes and deposited them with a Skellam share of the noise; the server "
            f"saw only the SecAgg+ sum, carrying noise multiplier z = {cfg.fedavg_noise_multiplier:g}. The per-client "
            "ε below holds against a server that runs that protocol; against one that deviates only a client's "
            "own share protects it (the figure beside it in the report)."
        )
        per_client, worst = per_client_sentence(ledgers, delta=delta, accountant=accountant, what="deltas deposited")
        from . import secure  # noqa: PLC0415 - the secure form builds on this module's neighbours

        rule = secure_rule(RULE_FEDAVG_SECURE, cfg.secagg_colluders)
        collusion = collusion_sentence(secure.plan(cfg), ledgers, delta)
        return assemble(list(ledgers.values()), [intro, per_client, f"Rule: {rule}.", collusion], worst)
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
