"""DP-MERF's server side through secure sums: cohorts, the sums it asks the shells to run, the
revealed mean, and the second guarantee (against a server that deviates) from its own records.

The server never holds a client's summary: it asks every client of a cohort to deposit its
encoded summary for the cohort's session (``secure.py``), then asks the shells for one SecAgg+ sum
per cohort over the nodes that acknowledged (``SumRequest``). What it learns is each revealed sum
and how many inputs it holds; the target is their total over the total count.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from common.privacy.records import ClientRecords
from common.privacy.statement import server_entry

from ..protocol import StepOutcome, SumRequest, SumResult
from . import secure
from .messages import MerfRequest
from .privacy import client_void

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

KIND_SECURE_SUM = "per client, server runs the secure sum"
KIND_DEVIATING = "per client, server deviates from the secure sum"
RULE_DEVIATING = (
    "against a server that deviates from the protocol (or colludes with enough clients to unmask one "
    "vector), only the client's own noise share protects it: Sk(μ/t), the Skellam mechanism on its "
    "rounded vector"
)


class SecureSide:
    """What DP-MERF's server keeps for secure aggregation (one per run)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.plan = secure.plan(cfg)
        self.range = secure.coordinate_range(self.plan)
        self.own_event = secure.events(self.plan, client_void(cfg))[1]
        self.own = ClientRecords(cfg.delta)  # the second guarantee, charged like the headline's records
        self.rng = np.random.default_rng(cfg.seed)
        self.pending: dict[str, list[int]] = {}  # session -> the nodes that deposited for it
        self.session_of: dict[int, str] = {}
        self.sums: list[dict[str, Any]] = []  # one entry per sum run: inputs, survivors, aborted

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, MerfRequest]]:
        """One session per cohort; every member asked to deposit for it."""
        out = []
        for i, cohort in enumerate(secure.cohorts(nodes, self.cfg, self.rng)):
            session = f"merf{step}c{i}-{secrets.token_hex(4)}"
            self.pending[session] = []
            for node in cohort:
                self.session_of[int(node)] = session
                out.append((int(node), MerfRequest(step=step, session=session)))
        return out

    def deposited(self, node: int, client: int) -> None:
        self.charge_own(client)
        self.pending[self.session_of[node]].append(node)

    def charge_own(self, client: int) -> None:
        self.own.charge(client, self.own_event)

    def sum_requests(self) -> list[SumRequest]:
        """One sum per cohort over the nodes that deposited; the pending sessions are handed over."""
        out = []
        for session, nodes in self.pending.items():
            if not nodes:  # nobody deposited: nothing to sum
                continue
            degree, threshold = secure.graph(self.cfg, len(nodes))
            floor = max(threshold, secure.fewest_survivors(self.cfg))
            out.append(SumRequest(session, sorted(nodes), self.range, self.plan.dim, threshold, degree, floor))
        self.pending = {}
        return out

    def mean(self, results: list[SumResult], outcome: StepOutcome, shape: tuple[int, int]) -> tuple[Any, int]:
        """(the mean summary over every revealed sum's inputs, their count); (None, 0) if none."""
        total, count = np.zeros(self.plan.dim, np.float64), 0
        for r in results:
            self.sums.append({"inputs": len(r.survivors), "dropouts": len(r.dropouts), "aborted": r.aborted})
            if r.total is None:
                outcome.notes.append(f"secure sum {r.session} revealed nothing: {r.aborted}")
                continue
            if r.dropouts:
                outcome.notes.append(
                    f"secure sum {r.session}: {len(r.dropouts)} node(s) dropped, the sum holds the rest"
                )
            total += np.asarray(r.total, np.float64) * self.plan.gamma
            count += len(r.survivors)
        if not count:
            return None, 0
        return torch.from_numpy(total / count).float().reshape(shape), count

    def beside(self, cfg: ExperimentConfig, clients: Iterable[int], *, final: bool) -> dict[str, Any]:
        """The worst client's ε against a server that deviates, from the records of its own shares."""
        ledgers = self.own.ledgers(clients)
        worst = max(ledgers.values(), key=lambda led: led.epsilon(delta=cfg.delta) if led.queries else 0.0)
        return server_entry(
            worst, delta=cfg.delta, accountant=cfg.accountant, kind=KIND_DEVIATING, rule=RULE_DEVIATING, final=final
        )

    def mechanism(self) -> dict[str, float]:
        return {"c": self.cfg.secagg_cohort, "t": self.plan.threshold, "μ (sum)": self.plan.mu}

    def parameters(self) -> dict[str, Any]:
        p = self.plan
        return {
            "cohort": self.cfg.secagg_cohort,
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
