"""A release through a secure sum: what a client sends (integers mod 2^b) and what it costs.

The plan (``SecureSumPlan``) fixes, for one kind of release, everything the clients and the server
must agree on: the vector's dimension d and clip bound C, the granularity γ = C / 2^14, the rounding
bound and hence the sensitivities, the cohort size c and reconstruction threshold t, the colluding
clients k the guarantee survives, the aggregate Skellam noise μ and each client's share μ/(t − k),
and the modulus bits b. ``encode`` is the client's side (clip, scale, conditionally round, add its
share, reduce mod 2^b), ``decode`` the server's (lift the revealed sum to signed integers, scale
back). Every survivor set of at least t clients, k of them colluding with the server (who subtract
their own shares), still carries Sk(μ) from its t − k honest members: the figure against a server
that runs the protocol (``protocol_event``); against one that deviates and reads a client's own
vector, only its share protects it (``own_event``). Both are recorded, each in its own ledger
(DESIGN §8). With k = 0 the first figure assumes that no client of a sum colludes: one colluder
leaves the others only Sk((t − 1)μ/t).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from common.privacy.events import PrivacyEvent
from common.privacy.ledger import PrivacyLedger
from common.privacy.skellam import (
    MAX_RELEASE_DIM,
    RELEASE_TAIL,
    conditional_round,
    modulus_bits,
    rounded_norm_bound,
    sensitivities,
    skellam_share,
    skellam_tail,
)

GRANULARITY_BITS = 14  # C / γ = 2^14: the rounding adds ~√d/2 to a norm of 16,384 (0.3% at d = 10⁴)
ROUNDING_BETA = 1e-9  # the chance a rounding draw must be redrawn, in the norm bound
RANGE_TAIL = RELEASE_TAIL  # an honest coordinate leaves its declared range with at most this probability


@dataclass(frozen=True)
class SecureSumPlan:
    dim: int
    clip: float
    cohort: int
    threshold: int
    mu: float  # Sk(μ) per coordinate of the t - k honest shares of a sum of t
    colluders: int = 0  # k: clients of a sum that may collude with the server

    def __post_init__(self) -> None:
        if not 1 <= self.threshold <= self.cohort:
            raise ValueError(f"the threshold must be in [1, cohort={self.cohort}], got {self.threshold}")
        if not 0 <= self.colluders < self.threshold:
            raise ValueError(f"the colluders must be in [0, threshold={self.threshold}), got {self.colluders}")
        if not (self.mu > 0 and self.clip > 0 and 0 < self.dim <= MAX_RELEASE_DIM):
            raise ValueError(f"a secure-sum plan needs mu, clip > 0 and dim in [1, {MAX_RELEASE_DIM}]")

    @property
    def gamma(self) -> float:
        return self.clip / 2**GRANULARITY_BITS

    @property
    def bound(self) -> float:
        """The norm of every rounded client vector (its sensitivity, before replace-one doubling)."""
        return rounded_norm_bound(self.clip, self.gamma, self.dim, ROUNDING_BETA)

    @property
    def honest(self) -> int:
        """t − k: the fewest honest shares in a revealed sum; they alone carry the charged Sk(μ)."""
        return self.threshold - self.colluders

    @property
    def mu_share(self) -> float:
        return self.mu / self.honest

    @property
    def bits(self) -> int:
        return min(62, modulus_bits(clients=self.cohort, bound=self.bound, mu_total=self.mu_share * self.cohort))

    def protocol_event(self, count: int = 1) -> PrivacyEvent:
        """What one release costs a client against a server that runs the protocol, colluding with at
        most k clients: it sees sums of ≥ t clients, whose t − k honest shares carry at least Sk(μ)."""
        l1, l2 = sensitivities(self.bound, self.dim)
        return PrivacyEvent.skellam(mu=self.mu, l1=l1, l2=l2, count=count)

    def own_event(self, count: int = 1) -> PrivacyEvent:
        """What it costs against a server that deviates and reads the client's own vector."""
        l1, l2 = sensitivities(self.bound, self.dim)
        return PrivacyEvent.skellam(mu=self.mu_share, l1=l1, l2=l2, count=count)


def plan_for(
    *,
    dim: int,
    clip: float,
    cohort: int,
    threshold: int,
    target_epsilon: float,
    releases: int,
    delta: float,
    colluders: int = 0,
) -> SecureSumPlan:
    """The plan whose μ is the smallest that keeps ``releases`` protocol events within the target."""

    bound = SecureSumPlan(dim, clip, cohort, threshold, 1.0, colluders).bound
    _, l2 = sensitivities(bound, dim)

    def eps(noise_multiplier: float) -> float:  # in Gaussian-equivalent units: μ = (σ Δ₂)² / 2
        p = SecureSumPlan(dim, clip, cohort, threshold, (noise_multiplier * l2) ** 2 / 2, colluders)
        return PrivacyLedger([p.protocol_event(releases)]).epsilon(delta=delta)

    low, high = 1e-3, 1e4
    if eps(high) > target_epsilon:
        raise ValueError(f"target ε={target_epsilon} is out of reach for a secure sum of this size")
    while high - low > 1e-4 * high:  # the smallest noise within the target, by bisection on a log scale
        mid = math.sqrt(low * high)
        low, high = (low, mid) if eps(mid) <= target_epsilon else (mid, high)
    return SecureSumPlan(dim, clip, cohort, threshold, (high * l2) ** 2 / 2, colluders)


def encode(x: np.ndarray, plan: SecureSumPlan, rng: np.random.Generator) -> np.ndarray:
    """The client's vector for the secure sum: ``encode_signed`` mod 2^b (uint64 values < 2^b)."""
    return np.mod(encode_signed(x, plan, rng), 2**plan.bits).astype(np.uint64)


def encode_signed(x: np.ndarray, plan: SecureSumPlan, rng: np.random.Generator) -> np.ndarray:
    """``x`` clipped to C, scaled by 1/γ, conditionally rounded to norm ≤ ``plan.bound``, plus its
    Sk(μ/(t − k)) share: signed int64 (what a node deposits; the secure sum reduces it mod 2^b).
    A non-finite coordinate (a diverged local step) is zeroed first: the release stays within its
    clip bound and the client answers instead of failing."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.shape[0] != plan.dim:
        raise ValueError(f"a vector of {x.shape[0]} coordinates for a plan of {plan.dim}")
    x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    norm = float(np.linalg.norm(x))
    clipped = x * min(1.0, plan.clip / norm) if norm > 0 else x
    rounded = conditional_round(clipped / plan.gamma, plan.bound, rng)
    return rounded + skellam_share(plan.dim, plan.mu_share, rng)


def decode(total: np.ndarray, plan: SecureSumPlan) -> np.ndarray:
    """The revealed sum mod 2^b lifted to signed integers (the centred representatives) and scaled back."""
    modulus = 2**plan.bits
    lifted = np.asarray(total, dtype=np.int64) % modulus
    lifted = np.where(lifted >= modulus // 2, lifted - modulus, lifted)
    return lifted.astype(np.float64) * plan.gamma


def noise_std(plan: SecureSumPlan, survivors: int) -> float:
    """The std of each coordinate of a decoded sum of ``survivors`` ≥ t clients (none colluding), in the
    vectors' units."""
    return plan.gamma * math.sqrt(2 * plan.mu_share * survivors)


# --- what a method's secure form needs (DP-MERF's summaries, GS-WGAN's gradients) -----------------
def fewest_survivors(cohort: int, threshold: int) -> int:
    """t: the fewest inputs a revealed sum holds (``threshold``, or ⌈2c/3⌉ when 0); the noise shares
    are calibrated so that t of them carry the whole noise."""
    return threshold or math.ceil(2 * cohort / 3)


def plan_with_multiplier(
    *, dim: int, clip: float, cohort: int, threshold: int, sigma: float, colluders: int = 0
) -> SecureSumPlan:
    """The plan whose revealed sum carries noise multiplier ``sigma`` in the Gaussian's units, from its
    t − k honest shares: μ = (σ·Δ₂)²/2, so the Skellam's std is σ times its ℓ₂ sensitivity, as the
    Gaussian's would be."""
    _, l2 = sensitivities(SecureSumPlan(dim, clip, cohort, threshold, 1.0).bound, dim)
    return SecureSumPlan(dim, clip, cohort, threshold, max((sigma * l2) ** 2 / 2, 1e-9), colluders)


def colluding_event(event: PrivacyEvent, plan: SecureSumPlan, colluders: int) -> PrivacyEvent:
    """``event`` (a protocol event of ``plan``) as it stands against a server colluding with
    ``colluders`` clients of a sum of t: they subtract their shares, leaving (t − colluders)·μ/(t − k).
    What a statement prints beside the headline to say what the run's k bought."""
    honest = max(plan.threshold - colluders, 0)
    mu = event.skellam_mu * honest / plan.honest
    return PrivacyEvent.skellam(mu=max(mu, 1e-12), l1=event.l1, l2=event.l2, count=event.count, void=event.void)


def coordinate_range(plan: SecureSumPlan) -> int:
    """R: every coordinate an honest client deposits lies in [-R, R] (its rounded vector's norm
    bound, plus its noise share's tail at ``RANGE_TAIL``); what the sum's modulus is sized for."""
    return int(math.ceil(plan.bound + skellam_tail(plan.mu_share, RANGE_TAIL)))


def release_events(plan: SecureSumPlan, void: str = "") -> tuple[PrivacyEvent, PrivacyEvent]:
    """(against a server that runs the protocol, against one that deviates) for one release."""
    protocol, own = plan.protocol_event(), plan.own_event()
    if not void:
        return protocol, own
    return tuple(PrivacyEvent.skellam(mu=e.skellam_mu, l1=e.l1, l2=e.l2, void=void) for e in (protocol, own))


def client_vector(x: np.ndarray, plan: SecureSumPlan, noise_seed: int, client_id: int, step: int) -> np.ndarray:
    """A client's deposit: ``x`` encoded for the sum (clipped, rounded, plus its share), signed int64;
    a fixed ``noise_seed`` (tests only) makes it reproducible."""
    seed = [noise_seed, client_id, step] if noise_seed >= 0 else secrets.randbits(128)
    vector = encode_signed(np.asarray(x).reshape(-1), plan, np.random.default_rng(seed))
    limit = coordinate_range(plan)
    if np.abs(vector).max(initial=0) > limit:  # probability below d·RANGE_TAIL: never for honest noise
        raise RuntimeError(f"a deposited coordinate exceeds the declared range {limit}; the release is withheld")
    return vector
