"""Every figure and sentence a report states about privacy, generated in one place from ledgers.

Strategies hand over ledgers (each client's record, the server's record of its sampling); this
module turns them into the per-client entries, the server-side figure and the plain-language
statement of metrics.jsonl, summary.json, privacy.json, report.html and the terminal. Each ε is a
ledger's (``PrivacyLedger.headline``), printed with δ, the accountant and the rule that applies;
an unbounded one is null with its reason, and a ledger holding a non-private release makes the
whole statement start with NOT PRIVATE.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .ledger import PrivacyLedger

if TYPE_CHECKING:  # a type only: common.config imports the methods, which import this package
    from common.config import ExperimentConfig

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
RULE_DPGAN = (
    "example-level, trusted curator: DP-SGD on the discriminator (Opacus; Poisson sampling q = B/N "
    "from a CSPRNG, per-example clipping of real and fake rows to C, noise σC), composed over the "
    "DP steps that ran (the discriminator's, and DPAC's classifier's on real data when it is on); "
    "generator steps are post-processing"
)
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
RULE_DP_MERF = (
    "per-client, untrusted server: each client releases its labelled mean embedding once, clipped to "
    "L2 norm S (so sensitivity 2S under replacing the client's whole data), with noise std 2σS per "
    "coordinate: one Gaussian mechanism with noise multiplier σ per release, composed over the client's "
    "own releases without amplification; everything the server computes afterwards is post-processing"
)
KIND_PER_CLIENT = "per client, untrusted server"
KIND_EXAMPLE = "per example, trusted curator"
KIND_AMPLIFIED = "amplified, trusted sampling"
KIND_USER = "user-level, trusted server"
ACCOUNTANT_NAMES = {"rdp": "Opacus RDP accountant (PRV beside it)", "prv": "Opacus PRV accountant (RDP beside it)"}
WOR_ACCOUNTANT = "RDP (Wang et al.'s bound, computed by fedgan; PRV has none for this sampling)"

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


def _json_eps(eps: float) -> float | None:
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
        "epsilon": _json_eps(eps),
        "epsilon_reason": reason or "",
    }
    if final:
        entry["epsilon_rdp"] = _json_eps(ledger.rdp_epsilon(delta=delta)[0])
        entry["epsilon_prv"] = ledger.epsilon_both(delta=delta)["epsilon_prv"] if ledger.queries else 0.0
        entry["epsilon_prv"] = None if entry["epsilon_prv"] is None else _json_eps(entry["epsilon_prv"])
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
        "epsilon": _json_eps(eps),
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
def _weak(eps: float | None) -> str:
    if eps is None or eps > WEAK_GUARANTEE_EPSILON:
        return (
            f" At ε above about {WEAK_GUARANTEE_EPSILON:g} (or unbounded) the formal guarantee is weak: it "
            "does not rule out that the generator reveals individual training examples."
        )
    return ""


def _per_client_sentence(
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


def _server_sentence(ledger: PrivacyLedger, *, delta: float, accountant: str, lead: str) -> str:
    entry = server_entry(ledger, delta=delta, accountant=accountant, kind="", rule="")
    if entry["epsilon"] is None:
        return f"{lead}: ε is unbounded ({entry['epsilon_reason']})."
    return (
        f"{lead}: ε = {fmt_epsilon(entry['epsilon'])} over {entry['steps']} recorded steps "
        f"(largest sampling rate {entry['sample_rate']:.4g}, noise multiplier {entry['query_noise_multiplier']:.4g})."
    )


def gswgan_statement(
    ledgers: Mapping[int, PrivacyLedger],
    server: PrivacyLedger,
    *,
    delta: float,
    accountant: str,
    noise_multiplier: float,
    batch_size: int,
    prior: str = "",
    warmup_steps: int = 0,
    grad_dct: int = 0,
    dpac_beta: float = 1.0,
) -> str:
    """GS-WGAN: the per-client headline from the clients' ledgers, the amplified figure from the
    server's record of its sampling. ``prior`` describes releases made before this run that its
    ledgers include (the debugging task's selection query); ``warmup_steps`` and ``grad_dct`` are
    the run's options, named because a reader asks whether they cost privacy (they do not); so is
    DPAC's classifier (``dpac_beta`` < 1), whose gradient is part of the one sanitized release."""
    nm = noise_multiplier / math.sqrt(batch_size)
    coords = f"as its {grad_dct}x{grad_dct} lowest 2-D DCT coefficients (a fixed public basis), " if grad_dct else ""
    intro = (
        f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Each answered query releases "
        f"B = {batch_size} noisy per-sample generator gradients ({coords}each clipped to norm C, noise std 2σC "
        f"with σ = {noise_multiplier:g}): one Gaussian mechanism with noise multiplier σ/√B = {nm:.4g}."
    )
    warm = f", its non-private warm start ({warmup_steps} iterations on its own data)" if warmup_steps else ""
    dpac = (
        f" DPAC (β = {dpac_beta:g}): each released per-sample gradient is that of β·(WGAN term) + (1−β)·(the "
        "cross-entropy of the client's own auxiliary classifier), clipped and noised once as above; the "
        "classifier, trained on the client's data, is never released either."
        if dpac_beta < 1
        else ""
    )
    unreleased = (
        f"A client's discriminator{warm} and its critic steps are never released and cost no privacy: "
        f"everything derived from its data reaches the server only through these sanitized answers.{dpac}"
    )
    per_client, worst = _per_client_sentence(ledgers, delta=delta, accountant=accountant, what="answered queries")
    amplified = _server_sentence(
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
    parts = [intro, unreleased, per_client, f"Rule: {RULE_PER_CLIENT}.", amplified, f"Rule: {RULE_AMPLIFIED_WOR}."]
    if prior:
        parts.append(prior)
    # NOT PRIVATE is about the headline: a void server ledger (reproducible sampling) voids only the
    # amplified figure, and its sentence says so.
    return _assemble(list(ledgers.values()), parts, worst)


def dp_merf_statement(
    ledgers: Mapping[int, PrivacyLedger],
    *,
    delta: float,
    accountant: str,
    noise_multiplier: float,
    clip: float,
    features: int,
    dct: int,
    releases_used: int,
) -> str:
    """DP-MERF: one noisy summary per client, the generator fitted to their mean on the server."""
    space = f"its {dct}x{dct} lowest 2-D DCT coefficients (a fixed public basis)" if dct else "its pixels"
    intro = (
        f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). DP-MERF: each client released "
        f"once the mean over its examples of φ(x) ⊗ onehot(y), where φ is {features} public random Fourier "
        f"frequencies of a Gaussian kernel on {space} plus a constant coordinate (‖φ‖ = 1), clipped to L2 "
        f"norm S = {clip:g}, with noise std 2σS per coordinate (σ = {noise_multiplier:g}): one Gaussian "
        "mechanism with noise multiplier σ. "
        f"The generator was fitted on the server to the mean of the {releases_used} accepted releases: "
        "post-processing, no further privacy cost."
    )
    per_client, worst = _per_client_sentence(ledgers, delta=delta, accountant=accountant, what="noisy summaries")
    return _assemble(list(ledgers.values()), [intro, per_client, f"Rule: {RULE_DP_MERF}."], worst)


def dpgan_statement(
    ledger: PrivacyLedger, *, delta: float, accountant: str, dpac_beta: float = 1.0, grouping: str = ""
) -> str:
    """Centralized DPGAN: one curator ledger, example-level (with DPAC, C's DP steps are in it)."""
    entry = client_entry(0, ledger, delta=delta, accountant=accountant)
    last = ledger.history[-1] if ledger.history else None
    eps = entry["epsilon"]
    body = (
        f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Centralized DPGAN: every training "
        f"example is protected at ε = {fmt_epsilon(eps)}"
        + (f" ({entry['epsilon_reason']})" if entry["epsilon_reason"] else "")
        + f" by DP-SGD on the discriminator over {ledger.queries} noisy steps"
        + (
            f" (DPAC, β = {dpac_beta:g}: these include its auxiliary classifier's DP-SGD steps on real data, "
            "at the same σ and q; its steps on generated data are post-processing)"
            if dpac_beta < 1
            else ""
        )
        + (f" (σ = {last.noise_multiplier:g}, q = {last.sample_rate:.4g})" if last else "")
        + ". This assumes the curator node that pools the data is trusted."
        + (f" {grouping}" if grouping else "")
    )
    return _assemble([ledger], [body, f"Rule: {RULE_DPGAN}."], eps)


def fedavg_statement(
    ledgers: Mapping[int, PrivacyLedger],
    server: PrivacyLedger,
    *,
    delta: float,
    accountant: str,
    clip: float,
    noise_multiplier: float,
) -> str:
    """Fed-Avg GAN: unbounded per client against the server; user-level with a trusted server."""
    intro = (
        f"Privacy statement (δ = {delta:g}, {ACCOUNTANT_NAMES[accountant]}). Fed-Avg GAN, user-level "
        f"DP-FedAvg: each round every sampled client's discriminator delta is clipped to L2 norm S = {clip:g} "
        f"and the server adds Gaussian noise of std zS (z = {noise_multiplier:g}) to their sum."
    )
    per_client, _ = _per_client_sentence(ledgers, delta=delta, accountant=accountant, what="raw deltas sent")
    user = _server_sentence(
        server,
        delta=delta,
        accountant=accountant,
        lead="With a trusted server that samples secretly and adds the noise, user-level",
    )
    server_eps = server.headline(delta=delta, accountant=accountant)[0] if server.queries else 0.0
    parts = [intro, per_client, f"Rule: {RULE_FEDAVG_UNTRUSTED}.", user, f"Rule: {RULE_FEDAVG_USER}."]
    # The clients' void marks (raw deltas) are the strategy, not a debugging option: only the
    # server's record decides whether the trusted-server figure is NOT PRIVATE.
    return _assemble([server], parts, _json_eps(server_eps))


def _assemble(ledgers: list[PrivacyLedger], parts: list[str], worst: float | None) -> str:
    notice = not_private_notice(not_private_reasons(ledgers))
    return notice + " ".join(parts) + _weak(worst)


_PROTECTED = {
    KIND_PER_CLIENT: "one client's whole data set, against the server itself",
    KIND_EXAMPLE: "one training example, against anyone who sees the released generator",
    KIND_USER: "one client's whole data set, against anyone who sees the released model (the server is trusted)",
}


# --- options that cost no privacy, named so that a reader need not ask ----------------------------
def public_data_sentence(cfg: ExperimentConfig) -> str:
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


def epsilon_meaning(epsilon: float | None, *, delta: float, kind: str = KIND_PER_CLIENT) -> str:
    """One sentence on what a headline ε of ``kind`` (its unit) means and where the trade-off
    against quality is shown."""
    where = "the README's privacy-utility frontier shows what quality each ε bought (bench/results/frontier-*.md)"
    if epsilon is None or not math.isfinite(epsilon):
        return f"no guarantee: something was released without noise; {where}"
    if epsilon <= 1:
        strength = "strong"
    elif epsilon <= 10:
        strength = "moderate, the usual target of the papers"
    else:
        strength = "weak: the odds bound alone is vacuous at this size, only ruling out near-certain inferences"
    return (
        f"except with probability δ = {delta:g}, no inference about {_PROTECTED.get(kind, kind)} can shift "
        f"anyone's odds by more than a factor e^ε = e^{epsilon:.3g} ({strength}); {where}"
    )
