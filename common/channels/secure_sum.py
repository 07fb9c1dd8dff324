"""The secure-sum channel (``--secure-aggregation``): a client's release is deposited on its node,
clipped, scaled to integers, rounded to a fixed norm and given a Skellam share of the noise
(``common/secagg/plan.py``); the server sees only SecAgg+ sums of at least t deposits, which carry
the whole noise (``server/secure_sum.py`` and ``client/secure_sum.py`` run the protocol;
``secure_server.py`` keeps the server's records).

Two guarantees per client, each from its own ledger: against a server that runs the protocol (the
sum's Sk(μ), μ = (σΔ₂)²/2 so σ keeps its meaning: the headline) and against one that deviates and
reads the client's own vector (its share Sk(μ/(t − k)): beside the headline). A node's budget
counts the second unless its policy says ``trust-secure-sum = true``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.options import check
from common.privacy import PrivacyEvent, PrivacyLedger
from common.secagg.plan import (
    SecureSumPlan,
    client_vector,
    coordinate_range,
    fewest_survivors,
    plan_with_multiplier,
    release_events,
)

from .secure_server import SecureSums, collusion_assumption, collusion_sentence, secure_kind
from .spec import SUMS, DepositingNode, ReleaseSpec

if TYPE_CHECKING:
    import torch

    from common.client_state import ClientState

RULE = (
    "per-client, server runs the secure sum ({collusion}): each client deposits {describes}, scaled to "
    "integers and conditionally rounded to a fixed norm, plus a Skellam share; the server sees only sums of at "
    "least t clients, which carry Sk(μ) with μ = (σΔ₂)²/2, noise multiplier {noise} in the Gaussian's units: "
    "one Skellam mechanism per release (Agarwal, Kairouz & Liu 2021, replace-one sensitivities of the rounded "
    "vector), composed over the client's own releases without amplification"
)


@dataclass(frozen=True)
class Admission:
    """A client's release admitted by its node's policy: the events to charge (against a server that
    runs the protocol, against one that deviates, and the one of the two its node counts)."""

    refused: str
    events: tuple[PrivacyEvent, PrivacyEvent, PrivacyEvent] | None = None


class SecureSumChannel:
    """Releases summed securely, each client adding a noise share (see the module docstring)."""

    name = "secure-sum"
    option = "secure_aggregation"
    needs = SUMS
    sums = True
    bounds_every_release = True  # clipped and share-noised on the node, whatever the method sends in the clear

    # --- the plan and its events -------------------------------------------------------------------
    def plan(self, cfg: Any, spec: ReleaseSpec) -> SecureSumPlan:
        """The run's plan: ``spec``'s vector, its cohort, t survivors and k colluders, and the sum's
        noise multiplier the spec's."""
        return plan_with_multiplier(
            dim=spec.dim,
            clip=spec.clip,
            cohort=spec.cohort,
            threshold=self.survivors(cfg, spec),
            sigma=spec.noise_multiplier,
            colluders=cfg.secagg_colluders,
        )

    @staticmethod
    def survivors(cfg: Any, spec: ReleaseSpec) -> int:
        """t of a sum over the spec's cohort (``--secagg-threshold``, or ⌈2c/3⌉)."""
        return fewest_survivors(spec.cohort, cfg.secagg_threshold)

    def events(self, cfg: Any, spec: ReleaseSpec) -> tuple[PrivacyEvent, PrivacyEvent]:
        return release_events(self.plan(cfg, spec), spec.void)

    def node_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        """A node's own share's multiplier, σ/√(t − k): the t − k honest shares of a sum carry σ."""
        return spec.noise_multiplier / math.sqrt(self.survivors(cfg, spec) - cfg.secagg_colluders)

    def revealed_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        return spec.noise_multiplier

    def cohort(self, cfg: Any, spec: ReleaseSpec) -> int:
        return spec.cohort

    def epsilon(self, cfg: Any, spec: ReleaseSpec, releases: int) -> float:
        """The per-client ε of ``releases`` releases against a server that runs the protocol."""
        return PrivacyLedger([self.plan(cfg, spec).protocol_event(releases)]).epsilon(delta=cfg.delta)

    # --- checks, words -------------------------------------------------------------------------------
    def check_run(self, cfg: Any, spec: ReleaseSpec) -> None:
        """Noise to share; a cohort of at least 3 (no smaller sum is an aggregate), no larger than the
        clients taking part (a larger one could reveal no sum of t inputs, and every client would spend
        its release for nothing: audit 4, items 9 and 12), at least ``secagg_threshold``; fewer
        colluders than the survivors t (the t − k honest ones carry the noise)."""
        field, cohort = spec.cohort_field, spec.cohort
        check(
            spec.noise_multiplier > 0,
            spec.noise_field,
            getattr(cfg, spec.noise_field),
            "must be > 0 with secure aggregation (its noise shares are what it protects with)",
        )
        taking_part = len(cfg.participants())
        check(
            cohort <= taking_part,
            field,
            cohort,
            f"must be at most the {taking_part} clients taking part (a smaller cohort could reveal no sum of "
            "t inputs, and every client would spend its release for nothing)",
        )
        check(cohort >= 3, field, cohort, "must be >= 3 with secure aggregation (these clients are the sum's cohort)")
        check(
            cfg.secagg_threshold <= cohort,
            "secagg_threshold",
            cfg.secagg_threshold,
            f"must be at most {field}={cohort} (those clients are the sum's cohort)",
        )
        t = self.survivors(cfg, spec)
        check(
            cfg.secagg_colluders < t,
            "secagg_colluders",
            cfg.secagg_colluders,
            f"must be below the {t} survivors of a sum (t; the t - k honest ones carry the noise)",
        )

    def kind(self, cfg: Any, clear_kind: str) -> str:
        return secure_kind(cfg.secagg_colluders)

    def rule(self, cfg: Any, spec: ReleaseSpec, clear_rule: str) -> str:
        collusion = collusion_assumption(cfg.secagg_colluders)
        return RULE.format(collusion=collusion, describes=spec.describes, noise=_noise_name(spec))

    def sentences(self, cfg: Any, spec: ReleaseSpec, ledgers: Mapping[int, PrivacyLedger]) -> list[str]:
        """What the statement says of the channel: how a release was summed, and what k bought."""
        t, k = self.survivors(cfg, spec), cfg.secagg_colluders
        how = (
            f"Secure aggregation: no {spec.what} was sent; each client deposited its {spec.what}, clipped, scaled to "
            f"integers and rounded to a fixed norm, with a Skellam share of the noise (Sk(μ/{t - k}) per coordinate), "
            f"and the server saw only SecAgg+ sums over {spec.cohort} clients ({spec.cohort_field}), each revealed "
            f"only if at least {t} deposits were in it, which carry Sk(μ), noise multiplier {_noise_name(spec)}. The "
            "per-client ε below holds against a server that runs that protocol; against one that deviates, only the "
            "client's own share protects it (the figure beside it in the report). No amplification by sampling is "
            "claimed."
        )
        collusion = collusion_sentence(self.plan(cfg, spec), ledgers, cfg.delta)
        return [how] + ([collusion] if collusion else [])

    # --- the client's side ---------------------------------------------------------------------------
    def session_mismatch(self, cfg: Any, session: str) -> str:
        """Why a node refuses a request without a secure-sum session (""): a release in the clear
        that the run promised to sum is never made."""
        return (
            ""
            if session
            else "the request asks for a release in the clear, but the run's releases go through secure sums"
        )

    def noised(self, cfg: Any, spec: ReleaseSpec, clipped: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
        raise TypeError("a secure sum's releases are deposited with a noise share, never noised in the clear")

    def admit(self, node: DepositingNode, state: ClientState, spec: ReleaseSpec) -> Admission:
        """The node's policy on the release's events, before anything is computed: the run's budget
        counts the protocol's, the node's ledger the one its policy counts (its own share's unless
        ``trust-secure-sum``)."""
        protocol, own = self.events(node.cfg, spec)
        over, counted = node.policy.secure_release_refusal(
            state.ledger, protocol, own, node.cfg, f"one more {spec.what}"
        )
        return Admission(over) if over else Admission("", (protocol, own, counted))

    def deposit(
        self,
        node: DepositingNode,
        state: ClientState,
        session: str,
        step: int,
        spec: ReleaseSpec,
        values: Any,
        admission: Admission,
        *,
        seeded: bool = True,
    ) -> PrivacyEvent:
        """A client's side of a release once admitted: ``values`` encoded with its share, the node's
        ledger charged with the event its policy counts and the run's with the protocol's, the state
        written, then the vector deposited (masked in the sum's third round, never sent in the clear).
        A crash in between over-counts, never under-counts. ``seeded``: the share follows the run's
        ``noise_seed`` (tests only) where the method's own noise would. Returns the protocol's event."""
        p = self.plan(node.cfg, spec)
        vector = client_vector(values, p, node.cfg.noise_seed if seeded else -1, state.client_id, step)
        protocol, own, counted = admission.events
        node.charge({state.client_id: [counted]})
        state.ledger.record(protocol)
        state.own_ledger.record(own)
        state.version += 1
        node.persist(state)
        node.deposit_secure_input(session, vector, floor=p.threshold, bound=coordinate_range(p))
        return protocol

    # --- the server's side ---------------------------------------------------------------------------
    def server(self, cfg: Any, spec: ReleaseSpec, client_of: Callable[[int], int]) -> SecureSums:
        return SecureSums(cfg, self.plan(cfg, spec), spec.void, client_of)


def _noise_name(spec: ReleaseSpec) -> str:
    return f"{spec.noise_multiplier:.4g}"
