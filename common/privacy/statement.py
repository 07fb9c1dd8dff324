"""Every figure and the shared sentences a report states about privacy, generated from ledgers.

Methods hand over ledgers (each client's record, the server's record of its sampling); this module
turns them into the per-client entries, the server-side figure and the sentences every statement
shares (the per-client guarantee, the server's figure, NOT PRIVATE, a weak ε, public data) of
metrics.jsonl, summary.json, privacy.json, report.html and the terminal. Each method's own rule and
the rest of its statement live in its folder (``common/methods/<name>/privacy.py``). Each ε is a
ledger's (``PrivacyLedger.headline``), printed with δ, the accountant and the rule that applies; an
unbounded one is null with its reason, and a ledger holding a non-private release makes the whole
statement start with NOT PRIVATE.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .ledger import PrivacyLedger

if TYPE_CHECKING:
    from common.config import RunOptions

KIND_PER_CLIENT = "per client, untrusted server"
KIND_EXAMPLE = "per example, trusted curator"
KIND_AMPLIFIED = "amplified, trusted sampling"
KIND_USER = "user-level, trusted server"
ACCOUNTANT_NAMES = {"rdp": "Opacus RDP accountant (PRV beside it)", "prv": "Opacus PRV accountant (RDP beside it)"}

# Above this ε the formal (ε, δ) guarantee says little; the statement says so in words.
WEAK_GUARANTEE_EPSILON = 10.0
DO_NOT_PUBLISH = (
    "Release only the generator (checkpoint.pt's released_generator, samples/, reports). Never publish "
    "clients/: in a simulation it holds every client's raw partition, its un-noised discriminator and "
    "optimizer state, and its ledger; on a real node that is the node's own disk (its state-dir). "
    "After `fedgan deploy --local`, never publish deploy/nodes/ (each node's disk, the same content), "
    "deploy/keys/ (the SuperNodes' private keys) or deploy/certs/ (the CA's and the server's private "
    "keys). Each of these folders holds a DO_NOT_PUBLISH.txt saying so."
)


def finite_or_none(eps: float) -> float | None:
    """ε as JSON holds it: null when unbounded."""
    return eps if math.isfinite(eps) else None


def fmt_epsilon(eps: float | None) -> str:
    if eps is None or math.isinf(eps):
        return "unbounded"
    return f"{eps:.3g}" if eps < 100 else f"{eps:,.0f}"


# --- figures ------------------------------------------------------------------------------------
def client_entry(
    client_id: int, ledger: PrivacyLedger, *, delta: float, accountant: str, final: bool = False
) -> dict[str, Any]:
    """One client's figures from its ledger: ``epsilon`` is the headline (``accountant``), null when
    unbounded with ``epsilon_reason``; ``epsilon_rdp``/``epsilon_prv`` beside it (PRV at the end)."""
    eps, reason = ledger.headline(delta=delta, accountant=accountant) if ledger.queries else (0.0, None)
    entry = {
        "client_id": client_id,
        "queries": ledger.queries,
        "epsilon": finite_or_none(eps),
        "epsilon_reason": reason or "",
    }
    if final:
        entry["epsilon_rdp"] = finite_or_none(ledger.rdp_epsilon(delta=delta)[0])
        entry["epsilon_prv"] = ledger.epsilon_both(delta=delta)["epsilon_prv"] if ledger.queries else 0.0
        entry["epsilon_prv"] = None if entry["epsilon_prv"] is None else finite_or_none(entry["epsilon_prv"])
        entry["ledger"] = ledger.state_dict()
    return entry


def max_epsilon(entries: Iterable[Mapping[str, Any]]) -> float | None:
    """Largest headline ε over entries that released something; None if any is unbounded."""
    values = [e["epsilon"] for e in entries if e["queries"] > 0]
    if any(v is None for v in values):
        return None
    return max(values, default=0.0)


def server_entry(
    ledger: PrivacyLedger, *, delta: float, accountant: str, kind: str, rule: str, final: bool = False
) -> dict[str, Any]:
    """The figure that rests on the server's behaviour (amplified or user-level), from its ledger."""
    eps, reason = ledger.headline(delta=delta, accountant=accountant) if ledger.queries else (0.0, None)
    history = ledger.history
    entry = {
        "epsilon": finite_or_none(eps),
        "epsilon_reason": reason or "",
        "kind": kind,
        "assumption": rule,
        "steps": ledger.queries,
        "sample_rate": max((e.sample_rate for e in history), default=0.0),
        "query_noise_multiplier": min((e.noise_multiplier for e in history), default=0.0),
        "sampling": "+".join(dict.fromkeys(e.sampling for e in history)),
    }
    if final:
        entry["ledger"] = ledger.state_dict()
    return entry


def not_private_reasons(ledgers: Iterable[PrivacyLedger]) -> list[str]:
    """Distinct reasons why some ledger's releases were not private (empty: none)."""
    return list(dict.fromkeys(r for ledger in ledgers for r in ledger.void_reasons))


def not_private_notice(reasons: list[str]) -> str:
    if not reasons:
        return ""
    return "NOT PRIVATE: " + "; ".join(reasons) + ". Every epsilon that covers these releases is unbounded. "


# --- statements ---------------------------------------------------------------------------------
def weak(eps: float | None) -> str:
    if eps is None or eps > WEAK_GUARANTEE_EPSILON:
        return (
            f" At ε above about {WEAK_GUARANTEE_EPSILON:g} (or unbounded) the formal guarantee is weak: it "
            "does not rule out that the generator reveals individual training examples."
        )
    return ""


def per_client_sentence(
    ledgers: Mapping[int, PrivacyLedger], *, delta: float, accountant: str, what: str
) -> tuple[str, float | None]:
    active = {cid: ledger for cid, ledger in ledgers.items() if ledger.queries > 0}
    if not active:
        return f"Per-client guarantee ({KIND_PER_CLIENT}): no client has released anything, so ε = 0.", 0.0
    entries = {cid: client_entry(cid, ledger, delta=delta, accountant=accountant) for cid, ledger in active.items()}
    unbounded = [cid for cid, e in entries.items() if e["epsilon"] is None or not math.isfinite(e["epsilon"])]
    counts = [ledger.queries for ledger in active.values()]
    lead = (
        f"Per-client guarantee ({KIND_PER_CLIENT}): {len(active)} of {len(ledgers)} clients made "
        f"{sum(counts)} releases ({what}; {min(counts)} to {max(counts)} each); "
    )
    if unbounded:
        return lead + (
            f"ε is unbounded for {len(unbounded)} of them ({entries[unbounded[0]]['epsilon_reason'] or 'no noise'}); "
            "clients that released nothing have ε = 0."
        ), None
    worst = max(entries, key=lambda c: (entries[c]["epsilon"], active[c].queries))  # ties: the most releases
    prv, why = active[worst].prv_epsilon(delta=delta)
    beside = f"PRV {fmt_epsilon(prv)}" if prv is not None else f"PRV not available: {why}"
    median = statistics.median(e["epsilon"] for e in entries.values())
    return lead + (
        f"the most exposed client ({worst}, {active[worst].queries} releases) has ε = "
        f"{fmt_epsilon(entries[worst]['epsilon'])} ({beside}); the median is ε = {fmt_epsilon(median)}; "
        "clients that released nothing have ε = 0."
    ), entries[worst]["epsilon"]


def server_sentence(ledger: PrivacyLedger, *, delta: float, accountant: str, lead: str) -> str:
    entry = server_entry(ledger, delta=delta, accountant=accountant, kind="", rule="")
    if entry["epsilon"] is None:
        return f"{lead}: ε is unbounded ({entry['epsilon_reason']})."
    return (
        f"{lead}: ε = {fmt_epsilon(entry['epsilon'])} over {entry['steps']} recorded steps "
        f"(largest sampling rate {entry['sample_rate']:.4g}, noise multiplier {entry['query_noise_multiplier']:.4g})."
    )


def assemble(ledgers: list[PrivacyLedger], parts: list[str], worst: float | None) -> str:
    notice = not_private_notice(not_private_reasons(ledgers))
    return notice + " ".join(parts) + weak(worst)


_PROTECTED = {
    KIND_PER_CLIENT: "one client's whole data set, against the server itself",
    KIND_EXAMPLE: "one training example, against anyone who sees the released generator",
    KIND_USER: "one client's whole data set, against anyone who sees the released model (the server is trusted)",
}


# --- options that cost no privacy, named so that a reader need not ask ----------------------------
def public_data_sentence(cfg: RunOptions) -> str:
    """One sentence for the privacy statement: what was declared public and what it was used for."""
    if not cfg.public_data:
        return ""
    what = {
        "synthetic": "the embedded synthetic handwriting (its own seed, no private writer)",
        "holdout": "a held-apart slice of the training data, in no client's partition",
    }[cfg.public_data]
    uses = f"a non-private warm start of {cfg.public_warmup_steps} steps" if cfg.public_warmup_steps else "no training"
    return (
        f"Declared public by the user ({cfg.public_size} examples): {what}; used for {uses}. Public data costs no "
        "privacy and is outside every ε here, so it must really be public."
    )


def protected(kind: str) -> str:
    """What a headline of ``kind`` protects, as a noun phrase: a kind of its own (a release channel's,
    "per client, server runs the secure sum, ...") names one client's data with the kind's terms."""
    if kind in _PROTECTED:
        return _PROTECTED[kind]
    if kind.startswith("per client, "):
        return f"one client's whole data set ({kind.removeprefix('per client, ')})"
    return kind


FRONTIER = "the frontier (docs/frontier.md) shows what quality each ε bought (bench/results/frontier-*.md)"


def epsilon_meaning(
    epsilon: float | None, *, delta: float, kind: str = KIND_PER_CLIENT, measured: str = FRONTIER
) -> str:
    """One sentence on what a headline ε of ``kind`` (its unit) bounds, then ``measured``: what this
    method's measured frontier shows near that ε (``common/evaluation/measured.py``), not a word on
    what papers usually target."""
    if epsilon is None or not math.isfinite(epsilon):
        return f"no guarantee: something was released without noise; {measured}"
    # Above 10 the factor e^ε exceeds 22,000: the bound rules out only near-certain inferences.
    vacuous = " (vacuous at this size alone: it rules out only near-certain inferences)" if epsilon > 10 else ""
    return (
        f"except with probability δ = {delta:g}, no inference about {protected(kind)} can shift "
        f"anyone's odds by more than a factor e^ε = e^{epsilon:.3g}{vacuous}; {measured}"
    )
