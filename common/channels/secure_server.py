"""The secure-sum channel's server part (``secure_sum.py`` is the channel), whatever a method sums
(DP-MERF's summaries, GS-WGAN's gradients, Fed-Avg's deltas): the sessions it opens, who
deposited, the sums it asks the shells to run (``SumRequest``), what they revealed, and the second
guarantee, against a server that deviates, from records of its own (``common/secagg/plan.py`` has
the plan and its events).

The server never holds a client's vector: it asks the clients of a session to deposit their encoded
release on their node, then asks the shells for one SecAgg+ sum per session over the nodes that
acknowledged. What it learns is each revealed sum and how many inputs it holds.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from common.privacy.ledger import PrivacyLedger
from common.privacy.policy import DEFAULT_MIN_SECAGG_COHORT
from common.privacy.records import ClientRecords
from common.privacy.statement import fmt_epsilon, server_entry
from common.secagg import cohort_graph, fewest_inputs
from common.secagg.plan import (
    SecureSumPlan,
    colluding_event,
    coordinate_range,
    release_events,
)
from common.secagg.requests import SumRequest, SumResult

from .spec import Outcome

MAX_STEP_ATTEMPTS = 3  # attempts at one step whose sums reveal nothing before the step is given up
MAX_SEEN = 200_000  # masked-vector digests kept for replay detection (6 MB); then the oldest are forgotten
KIND_SECURE_SUM = "per client, server runs the secure sum"
KIND_DEVIATING = "per client, server deviates from the secure sum"
RULE_DEVIATING = (
    "against a server that deviates from the protocol (or colludes with enough clients to unmask one "
    "vector), only the client's own noise share protects it: Sk(μ/(t − k)), the Skellam mechanism on its "
    "rounded vector, composed over the client's own releases"
)


def collusion_assumption(colluders: int) -> str:
    """What the headline assumes of colluding clients (``--secagg-colluders`` k), for every rule and
    statement that prints it: a colluder knows its own share and the server subtracts it."""
    if colluders == 0:
        return (
            "honest-but-curious and colluding with no client of a sum: a colluding client hands the server its own "
            "noise share, and one colluder leaves the others only Sk((t − 1)μ/t)"
        )
    return (
        f"honest-but-curious, colluding with at most {colluders} client(s) of each sum: the noise shares are "
        f"calibrated so that the t − {colluders} honest survivors of a sum carry Sk(μ)"
    )


def secure_kind(colluders: int) -> str:
    """The headline's kind through secure sums, naming the collusion it holds against."""
    return f"{KIND_SECURE_SUM}, " + ("no colluding client" if colluders == 0 else f"≤ {colluders} colluding clients")


def secure_basis(colluders: int) -> str:
    """release.json's basis of a secure run's per-client ε: what it assumes of the server and of
    colluding clients, and where the figure against a deviating server is."""
    who = "no client of a sum" if colluders == 0 else f"at most {colluders} client(s) of each sum"
    return (
        "every client's ledger, maximum over clients, assuming the server ran the secure sum (SecAgg+) as "
        f"specified and colluded with {who}: a colluding client hands it its own noise share, which lowers what "
        "protects the others; no client sampling is relied on. Against a server that deviates from the protocol "
        "only a client's own noise share protects it: epsilon_amplified holds that figure"
    )


def collusion_sentence(plan: SecureSumPlan, ledgers: Mapping[int, PrivacyLedger], delta: float) -> str:
    """What the run's k bought, for its privacy statement: the most exposed client's ε against one
    colluder more than the shares were calibrated for (a sum of t whose k + 1 colluders subtract their
    shares leaves (t − k − 1)·μ/(t − k))."""
    k = plan.colluders
    active = [ledger for ledger in ledgers.values() if ledger.queries]
    if not active:
        return ""
    worse = [
        PrivacyLedger([colluding_event(e, plan, k + 1) if e.noise == "skellam" else e for e in ledger.history])
        for ledger in active
    ]
    beyond = max(ledger.epsilon(delta=delta) for ledger in worse)
    calibrated = f"for t − k = {plan.honest} honest survivors of a sum of t = {plan.threshold} (k = {k})"
    return (
        f"Collusion: the noise shares were calibrated {calibrated}, so the per-client ε holds against a server "
        f"colluding with up to {k} client(s) of each sum; against {k + 1} colluders the most exposed client's ε "
        f"would be {fmt_epsilon(beyond)} (--secagg-colluders raises k, each share's noise with it)."
    )


class SecureSums:
    """What a method's server keeps for its secure sums (one per run)."""

    def __init__(self, cfg: Any, plan: SecureSumPlan, void: str = "", client_of: Callable[[int], int] = int) -> None:
        self.cfg, self.plan, self.client_of = cfg, plan, client_of
        self.range = coordinate_range(plan)
        self.own_event = release_events(plan, void)[1]  # the client's own share: the deviating server's figure
        self.own = ClientRecords(cfg.delta)  # the second guarantee, charged like the headline's records
        self.pending: dict[str, list[int]] = {}  # session -> the nodes that deposited for it
        self.session_of: dict[int, str] = {}
        self.sums: list[dict[str, Any]] = []  # one entry per sum run: inputs, dropouts, why it aborted
        self.seen: set[bytes] = set()  # digests of the masked vectors of this run's sums (a replay is named)
        self.spoiled: list[set[int]] = []  # the inputs of each sum an out-of-range input spoiled, since the last naming
        self.cleared: set[int] = set()  # nodes whose inputs were in a sum that revealed a sound total
        self.attempts: dict[int, int] = {}  # step -> attempts whose sums revealed nothing

    @property
    def fewest_to_ask(self) -> int:
        """The fewest clients worth asking for one sum: t, and never fewer than a default node
        policy's smallest cohort (a sum of two tells each its partner's input; such a node refuses)."""
        return max(self.plan.threshold, DEFAULT_MIN_SECAGG_COHORT)

    def open(self, step: int, nodes: Iterable[int], tag: str = "") -> str:
        """A new session for ``nodes``; returns its id (random, so no two runs share one)."""
        session = f"{tag}{step}-{secrets.token_hex(6)}"
        self.pending[session] = []
        for node in nodes:
            self.session_of[int(node)] = session
        return session

    def deposited(self, node: int, client: int) -> None:
        self.charge_own(client)
        self.pending[self.session_of[node]].append(node)

    def charge_own(self, client: int) -> None:
        self.own.charge(client, self.own_event)

    def seen_digests(self) -> set[bytes]:
        """The run's masked-vector digests, handed to each sum (bounded: a full set starts afresh)."""
        if len(self.seen) > MAX_SEEN:
            self.seen.clear()
        return self.seen

    def requests(self) -> list[SumRequest]:
        """One sum per session over the nodes that deposited (none for an empty one); the pending
        sessions are handed over."""
        out = []
        for session, nodes in self.pending.items():
            if not nodes:
                continue
            degree, threshold = cohort_graph(len(nodes), self.cfg.secagg_degree, self.plan.threshold)
            floor = fewest_inputs(threshold, self.plan.threshold)
            request = SumRequest(session, sorted(nodes), self.range, self.plan.dim, threshold, degree, floor)
            request.seen = self.seen_digests()
            out.append(request)
        self.pending, self.session_of = {}, {}
        return out

    def total(self, results: list[SumResult], outcome: Outcome) -> tuple[np.ndarray | None, int]:
        """(the sum of every revealed sum, in the vectors' units; how many inputs it holds), or
        (None, 0) when none was revealed; a note per sum that aborted or lost nodes. Every node a sum
        named (``SumResult.culprits``), or that every sum an out-of-range input spoiled held, is marked
        failed in ``outcome``: the run never asks it again."""
        total, count = np.zeros(self.plan.dim, np.float64), 0
        for r in results:
            entry = {"inputs": len(r.survivors), "dropouts": len(r.dropouts), "aborted": r.aborted}
            self.sums.append(entry | ({"culprits": len(r.culprits), "attempts": r.attempts} if r.culprits else {}))
            self._exclude(r.session, r.culprits, outcome)
            if r.total is None:
                lost = {n: why for n, why in r.dropouts.items() if n not in r.culprits}
                outcome.notes.append(f"secure sum {r.session} revealed nothing: {r.aborted}")
                if lost:
                    outcome.notes.append(f"secure sum {r.session}: {self._who(lost)} dropped")
                self._exclude(r.session, self._spoiled_by(r.suspects), outcome)
                continue
            dropped = {n: why for n, why in r.dropouts.items() if n not in r.culprits}
            if dropped:
                outcome.notes.append(f"secure sum {r.session}: {self._who(dropped)} dropped, the sum holds the rest")
            total += np.asarray(r.total, np.float64) * self.plan.gamma
            count += len(r.survivors)
            self.cleared.update(r.survivors)
        return (total, count) if count else (None, 0)

    def _who(self, dropped: dict[int, str], shown: int = 5) -> str:
        """The clients that dropped and why, the first few by name (audit 4: dropouts went unnamed)."""
        named = "; ".join(f"client {self.client_of(n)} ({why[:120]})" for n, why in sorted(dropped.items())[:shown])
        more = f"; {len(dropped) - shown} more" if len(dropped) > shown else ""
        return f"{len(dropped)} node(s): {named}{more}"

    def _exclude(self, session: str, culprits: dict[int, str], outcome: Outcome) -> None:
        for node, why in sorted(culprits.items()):
            outcome.failed_nodes.append(node)
            outcome.failure_reasons[node] = f"named by secure sum {session}: {why}"
            client = self.client_of(node)
            outcome.notes.append(
                f"secure sum {session}: client {client} (node {node}) is named and never asked again: {why}"
            )

    def _spoiled_by(self, suspects: list[int]) -> dict[int, str]:
        """An out-of-range input spoils a sum without saying whose it was (inputs are masked). The
        sums it spoiled are kept; a node whose input was in a sum that revealed a sound total is
        cleared; once the nodes every spoiled sum held, less the cleared, narrow to one, it is named."""
        if not suspects:
            return {}
        self.spoiled.append(set(suspects))
        left = set.intersection(*self.spoiled) - self.cleared
        if len(left) != 1:
            return {}
        spoiled, self.spoiled = len(self.spoiled), []
        return {
            left.pop(): f"its input was in each of the {spoiled} sum(s) an out-of-range input spoiled, and every "
            "other node of them was in a sum that revealed a sound total"
        }

    def gave_up(self, step: int, outcome: Outcome) -> bool:
        """Whether ``step`` is given up: its sums revealed nothing ``MAX_STEP_ATTEMPTS`` times (each
        attempt's releases charged). The run then moves on without an update instead of asking the
        same step again without end (audit 4, item 10: one rogue kept a run on one step, ε 556)."""
        self.attempts[step] = self.attempts.get(step, 0) + 1
        if self.attempts[step] < MAX_STEP_ATTEMPTS:
            return False
        outcome.took_step = True
        outcome.notes.append(
            f"step {step}: given up after {MAX_STEP_ATTEMPTS} attempts whose secure sums revealed nothing (each "
            "attempt's releases are charged); the next step goes on without this one's update"
        )
        return True

    def beside(self, clients: Iterable[int], *, final: bool, prior: PrivacyLedger | None = None) -> dict[str, Any]:
        """The worst client's ε against a server that deviates, from the records of its own shares,
        each after ``prior`` (a seeded run's stage 1: the same one release for every client)."""
        cfg = self.cfg
        ledgers = self.own.ledgers(list(clients))
        if prior is not None:
            ledgers = {c: prior.combined(led) for c, led in ledgers.items()}
        worst = max(ledgers.values(), key=lambda led: led.epsilon(delta=cfg.delta) if led.queries else 0.0)
        return server_entry(
            worst, delta=cfg.delta, accountant=cfg.accountant, kind=KIND_DEVIATING, rule=RULE_DEVIATING, final=final
        )

    def mechanism(self) -> dict[str, float]:
        return {"t": self.plan.threshold, "μ (sum)": self.plan.mu}

    def parameters(self) -> dict[str, Any]:
        p = self.plan
        return {
            "cohort": p.cohort,
            "fewest_survivors": p.threshold,
            "degree": self.cfg.secagg_degree or "auto",
            "granularity": p.gamma,
            "rounded_norm_bound": p.bound,
            "skellam_mu_sum": p.mu,
            "skellam_mu_share": p.mu_share,
            "coordinate_range": self.range,
            "noise_multiplier_share": self.own_event.noise_multiplier,
            "sums": self.sums,
        }

    def section(self) -> dict[str, Any]:
        """Its part of the report's parameters, under the option that turned it on."""
        return {"secure_aggregation": self.parameters()}

    def state_dict(self) -> dict[str, Any]:
        return {"own_records": self.own.state_dict(), "sums": list(self.sums)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.own.load_state_dict(state["own_records"])
        self.sums = list(state.get("sums", []))
