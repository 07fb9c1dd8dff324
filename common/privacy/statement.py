"""Plain-language privacy statement generated from the clients' ledgers (DESIGN.md §3).

Every ε here comes from what the ledgers recorded, and is printed with δ, the accountant and the
rule that applies.
"""

from __future__ import annotations

import math
import statistics

from .analysis import amplified_epsilon, check_delta, query_noise_multiplier
from .ledger import PrivacyLedger

ACCOUNTING_RULE_PER_CLIENT = (
    "per-client, untrusted server: each answered query is one Gaussian mechanism with noise "
    "multiplier σ/√B (sensitivity 2C, noise std 2σC, B samples per query), composed over the "
    "client's own queries without amplification; Opacus RDP accountant (PRV beside it)"
)
ACCOUNTING_RULE_AMPLIFIED = (
    "amplified, trusted sampling (an assumption about the server): the server samples m of K "
    "clients uniformly each generator step, treated as a Poisson-subsampled Gaussian with "
    "q = m/K and noise multiplier σ/√B over the T generator steps that ran; Opacus RDP accountant"
)

# Above this ε the formal (ε, δ) guarantee says little; the statement says so in words.
WEAK_GUARANTEE_EPSILON = 10.0


def _fmt(eps: float | None) -> str:
    if eps is None:
        return "not available"
    if math.isinf(eps):
        return "unbounded (no noise)"
    return f"{eps:.3g}" if eps < 100 else f"{eps:,.0f}"


def _per_client_sentence(ledgers: dict[int, PrivacyLedger], *, delta: float) -> str:
    active = {cid: ledger for cid, ledger in ledgers.items() if ledger.queries > 0}
    if not active:
        return "Per-client guarantee (headline, untrusted server): no client has answered a query, so ε = 0."
    eps = {cid: ledger.epsilon(delta=delta) for cid, ledger in active.items()}
    worst = max(eps, key=lambda cid: eps[cid])
    prv, reason = active[worst].prv_epsilon(delta=delta)
    prv_text = _fmt(prv) if prv is not None else f"not available ({reason})"
    counts = [ledger.queries for ledger in active.values()]
    return (
        f"Per-client guarantee (headline, untrusted server): {len(active)} of {len(ledgers)} clients "
        f"answered {sum(counts)} queries ({min(counts)} to {max(counts)} each). The most exposed "
        f"client ({worst}, {active[worst].queries} queries) has ε = {_fmt(eps[worst])} (RDP; PRV: "
        f"{prv_text}); the median over answering clients is ε = {_fmt(statistics.median(eps.values()))}; "
        f"clients that answered nothing have ε = 0. Rule: {ACCOUNTING_RULE_PER_CLIENT}."
    )


def _amplified_sentence(
    ledgers: dict[int, PrivacyLedger],
    *,
    delta: float,
    clients_per_step: int,
    num_clients: int,
    steps: int,
    query_nm: float,
) -> str:
    # Conservative against a ledger/config mismatch: use the smallest noise multiplier any ledger
    # recorded, and at least as many steps as the recorded queries require.
    recorded = {e.noise_multiplier for ledger in ledgers.values() for e in ledger.history}
    nm = min(recorded | {query_nm})
    total = sum(ledger.queries for ledger in ledgers.values())
    steps = max(steps, math.ceil(total / clients_per_step))
    q = clients_per_step / num_clients
    eps = amplified_epsilon(noise_multiplier=nm, sample_rate=q, steps=steps, delta=delta)
    mismatch = (
        f" (ledgers record a noise multiplier of {nm:.4g}, below the configured "
        f"{query_nm:.4g}; the smaller is used)"
        if nm < query_nm
        else ""
    )
    return (
        f"Amplified guarantee (secondary, assumes the server samples {clients_per_step} of "
        f"{num_clients} clients uniformly at random, which a client cannot verify): ε = {_fmt(eps)} "
        f"after {steps} generator steps (q = {q:.4g}, noise multiplier {nm:.4g}){mismatch}. "
        f"Rule: {ACCOUNTING_RULE_AMPLIFIED}."
    )


def privacy_statement(
    ledgers: dict[int, PrivacyLedger],
    *,
    delta: float,
    clients_per_step: int,
    num_clients: int,
    steps: int,
    noise_multiplier: float,
    batch_size: int,
) -> str:
    """One paragraph stating what the released generator guarantees, generated from the ledgers.

    ``steps`` is the number of generator steps that ran; ``noise_multiplier`` is σ (the per-sample
    one) and ``batch_size`` B, used for the description and the amplified figure.
    """
    check_delta(delta)
    if not 1 <= clients_per_step <= num_clients:
        raise ValueError(f"need 1 <= clients_per_step <= num_clients, got {clients_per_step}, {num_clients}")
    query_nm = query_noise_multiplier(noise_multiplier=noise_multiplier, batch_size=batch_size)
    intro = (
        f"Privacy statement (δ = {delta:g}). Each answered query releases B = {batch_size} noisy "
        f"per-sample generator gradients (each clipped to norm C, noise std 2σC with σ = "
        f"{noise_multiplier:g}): one Gaussian mechanism with noise multiplier σ/√B = {query_nm:.4g}."
    )
    per_client = _per_client_sentence(ledgers, delta=delta)
    amplified = _amplified_sentence(
        ledgers, delta=delta, clients_per_step=clients_per_step, num_clients=num_clients,
        steps=steps, query_nm=query_nm,
    )
    worst = max((ledger.epsilon(delta=delta) for ledger in ledgers.values()), default=0.0)
    caveat = (
        f" At ε above about {WEAK_GUARANTEE_EPSILON:g} the formal guarantee is weak: it does not rule "
        "out that the generator reveals individual training examples."
        if worst > WEAK_GUARANTEE_EPSILON
        else ""
    )
    return " ".join([intro, per_client, amplified]) + caveat
