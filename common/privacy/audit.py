"""Empirical lower bounds on ε from a privacy audit: what the mechanisms that ran really gave.

Every ε the project prints is an upper bound computed from a ledger. An audit checks it by
experiment: canaries (at the method's privacy unit) are inserted or not, each with probability ½,
an attacker scores each canary from what the threat model lets it see, and the scores yield a
*lower* bound on ε at a stated confidence. A lower bound above the ledger's ε means the accounting
lies (noise smaller than recorded, a release never charged, a noise stream an attacker can predict).

Two bounds, both from the attacker's guesses (``Guesses``):

- ``one_run_epsilon`` (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training
  run", Theorem 3.1 and its (ε, δ) form): with m canaries included independently with probability
  ½ and an attacker that guesses on r of them (abstaining on the rest), an (ε, δ)-DP mechanism lets
  the number of correct guesses exceed v only with probability at most
  P[Binomial(r, e^ε/(1+e^ε)) ≥ v] + 2mδ·max_i P[v−i ≤ Binomial(r, ·) < v]/i. The bound is the
  largest ε this p-value rejects at significance β.
- ``clopper_pearson_epsilon``: the classic bound from the true/false positive rates of a threshold
  test, each with a one-sided Clopper–Pearson interval (Bonferroni: β/2 each), ε ≥ log((TPR_lo − δ)
  / FPR_hi) (Jagielski et al. 2020; Nasr et al. 2021), where the canary trials are independent.

- ``gaussian_mu_lower``: a lower bound on μ for the claim "the mechanism is μ-GDP" (Dong, Roth & Su
  2022): μ-GDP forces TPR ≤ Φ(Φ⁻¹(FPR) + μ) for every test, so Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi) bounds μ from
  below. Every per-client release audited here is a Gaussian mechanism, whose ledger claims exactly
  that (``claimed_mu``); ``gaussian_epsilon`` turns a μ into the ε(δ) of its Gaussian curve. This is
  the figure that can come near the ledger's ε at the δ we use (1e-5): an (ε, δ) bound from
  thresholds alone lives in tails a few thousand canaries cannot see.

Pure math: no knowledge of any method. ``simulations/experiments/audit.py`` runs the canaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

EPS_CEILING = 60.0  # ε beyond this is reported as this: e^60 odds are certainty for any audit here


@dataclass(frozen=True)
class Guesses:
    """An attacker's guesses: r of m canaries guessed ("in" or "out"), v of them right."""

    m: int
    r: int
    v: int

    def __post_init__(self) -> None:
        if not 0 <= self.v <= self.r <= self.m:
            raise ValueError(f"need 0 <= correct ({self.v}) <= guesses ({self.r}) <= canaries ({self.m})")


def one_run_p_value(g: Guesses, eps: float, delta: float) -> float:
    """P[at least v of r guesses right] for an (ε, δ)-DP mechanism (Steinke et al. 2023)."""
    q = float(special.expit(eps))  # the accuracy of ε-DP randomized response, e^ε / (1 + e^ε)
    tail = float(stats.binom.sf(g.v - 1, g.r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or g.v == 0:
        return tail
    i = np.arange(1, g.v + 1)
    below = stats.binom.sf(g.v - i - 1, g.r, q) - tail  # P[v - i <= Binomial(r, q) < v]
    return min(1.0, tail + 2 * g.m * delta * float(np.max(below / i)))


def one_run_epsilon(g: Guesses, *, delta: float, significance: float) -> float:
    """The largest ε whose (ε, δ) claim the guesses reject at ``significance`` (0: none rejected)."""
    if g.r == 0 or one_run_p_value(g, 0.0, delta) > significance:
        return 0.0
    if one_run_p_value(g, EPS_CEILING, delta) <= significance:
        return EPS_CEILING
    return float(optimize.brentq(lambda e: one_run_p_value(g, e, delta) - significance, 0.0, EPS_CEILING, xtol=1e-6))


def best_one_run_epsilon(
    scores: np.ndarray, inserted: np.ndarray, *, delta: float, significance: float, steps: int = 40
) -> tuple[float, Guesses]:
    """The attacker's best one-run bound: guess "in" for the k_+ highest scores and "out" for the k_-
    lowest, abstaining between, over a grid of (k_+ = k_-) guess counts. The grid is fixed before the
    scores are seen and the bound taken over it is corrected for the search (Bonferroni: each point
    at significance / steps), so the maximum stays a valid lower bound."""
    m = len(scores)
    order = np.argsort(-scores)
    per_point = significance / steps
    best, best_g = 0.0, Guesses(m, 0, 0)
    for k in np.unique(np.linspace(1, m // 2, steps).astype(int)):
        top, bottom = order[:k], order[-k:]
        g = Guesses(m, 2 * int(k), int(inserted[top].sum() + (~inserted[bottom]).sum()))
        eps = one_run_epsilon(g, delta=delta, significance=per_point)
        if eps > best:
            best, best_g = eps, g
    return best, best_g


def clopper_pearson_epsilon(
    in_scores: np.ndarray, out_scores: np.ndarray, threshold: float, *, delta: float, significance: float
) -> tuple[float, float, float]:
    """(ε lower bound, TPR, FPR) of the test "score > threshold" on independent trials: the
    one-sided Clopper–Pearson lower bound of TPR and upper bound of FPR at significance / 2 each."""
    tp, n_in = int((in_scores > threshold).sum()), len(in_scores)
    fp, n_out = int((out_scores > threshold).sum()), len(out_scores)
    tpr_lo, _ = interval(tp, n_in, significance / 2)
    _, fpr_hi = interval(fp, n_out, significance / 2)
    eps = math.log((tpr_lo - delta) / fpr_hi) if tpr_lo > delta and fpr_hi > 0 else 0.0
    return max(0.0, min(eps, EPS_CEILING)), tp / max(n_in, 1), fp / max(n_out, 1)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε(δ) of a Gaussian mechanism of sensitivity-to-noise ratio μ (μ-GDP; Balle & Wang
    2018): the smallest ε with Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) ≤ δ. The ceiling of what any audit of
    such a mechanism can find; the ledgers' RDP figure sits above it."""
    if mu <= 0:
        return 0.0

    def excess(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0 and hi < 1e4:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-9))


def claimed_mu(noise_multipliers: list[float], counts: list[int]) -> float:
    """μ of the Gaussian releases a ledger claims (no sampling): each release of noise multiplier σ
    is 1/σ-GDP, and k of them compose to sqrt(Σ k/σ²)-GDP (inf with a release without noise)."""
    if any(s <= 0 for s in noise_multipliers):
        return math.inf
    return math.sqrt(sum(k / s**2 for s, k in zip(noise_multipliers, counts, strict=True)))


def interval(hits: int, n: int, significance: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (lower, upper) of a rate of ``hits`` in ``n``, each at
    ``significance``."""
    lower = float(stats.beta.ppf(significance, hits, n - hits + 1)) if hits > 0 else 0.0
    upper = float(stats.beta.ppf(1 - significance, hits + 1, n - hits)) if hits < n else 1.0
    return lower, upper


def gaussian_mu_lower(in_scores: np.ndarray, out_scores: np.ndarray, threshold: float, *, significance: float) -> float:
    """A lower bound on μ of any μ-GDP claim for the test "score > threshold" on independent
    trials: Φ⁻¹(TPR_lo) − Φ⁻¹(FPR_hi), each rate's Clopper–Pearson bound at significance / 2."""
    tpr_lo, _ = interval(int((in_scores > threshold).sum()), len(in_scores), significance / 2)
    _, fpr_hi = interval(int((out_scores > threshold).sum()), len(out_scores), significance / 2)
    if tpr_lo <= 0.0 or fpr_hi >= 1.0:
        return 0.0
    return max(0.0, float(stats.norm.ppf(tpr_lo) - stats.norm.ppf(fpr_hi)))
