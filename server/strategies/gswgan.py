"""GS-WGAN (Chen et al. 2020), federated: DESIGN.md §2 as strategy hooks.

Per generator step: sample m clients uniformly, send each (n_critic+1)*B generated samples with
server-drawn labels (only the B queried ones when clients reuse fakes for their critic steps,
``critic_fakes``), receive B sanitized per-sample gradients from each, divide by B*m, backpropagate
through G, step Adam, update the EMA. Samples travel as uint8 by default; the gradient the client
returns is applied at G's unquantized output (straight-through, see ``ServerGenerator.apply``).
The server mirrors each client's ledger from the privacy events in the answers (for live ε); the
clients' own ledgers, fetched at the end, are authoritative.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from torch import nn

from client.flower_wire import decode_answer, decode_records, encode_query, encode_records
from common.codec import GsAnswer, GsQuery, PayloadError, encode_labels, encode_samples, validate_answer
from common.config import ExperimentConfig
from common.privacy import (
    ACCOUNTING_RULE_AMPLIFIED,
    ACCOUNTING_RULE_PER_CLIENT,
    PrivacyEvent,
    PrivacyLedger,
    amplified_epsilon,
    privacy_statement,
    query_noise_multiplier,
)
from server.generator import ServerGenerator

from .base import Incoming, Outgoing, StepOutcome, Strategy

MSG_QUERY = "train.gswgan"
MSG_LEDGER = "query.ledger"


# The ledger of every client never queried: read-only, shared so its (zero) ε is computed once,
# not once per client per metrics line (3,400 clients in a FEMNIST-sized federation).
_NO_RELEASES = PrivacyLedger()


class GsWganStrategy(Strategy):
    name = "gswgan"

    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.generator = ServerGenerator(cfg, num_classes)
        self.ledgers: dict[int, PrivacyLedger] = {}
        self.authoritative: dict[int, PrivacyLedger] = {}
        self.node_client: dict[int, int] = {}
        self.steps_done = 0
        self._attached: dict[int, torch.Tensor] = {}

    # --- hooks ---------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        m = min(self.cfg.clients_per_step, len(available))
        order = torch.randperm(len(available), generator=self.generator.rng)[:m]
        return [available[i] for i in order.tolist()]

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        out = []
        self._attached = {}
        for node in nodes:
            fakes, labels, attached = self.generator.query_batches(self.cfg.batch_size, self._critic_batches())
            self._attached[node] = attached
            out.append(Outgoing(node, MSG_QUERY, encode_query(self._query(step, fakes, labels))))
        return out

    def _critic_batches(self) -> int:
        """Critic batches sent along with the queried one: none when clients reuse fakes."""
        return self.cfg.n_critic if self.cfg.critic_fakes == "fresh" else 0

    def _query(self, step: int, fakes: torch.Tensor, labels: torch.Tensor) -> GsQuery:
        """Samples and labels in their wire encodings (the samples are public: any encoding is fine)."""
        fake, encoding = encode_samples(fakes.numpy(), self.cfg.wire_samples,
                                        compress=self.cfg.wire_compression == "deflate")
        return GsQuery(step=step, batch_size=self.cfg.batch_size, fake=fake, fake_encoding=encoding,
                       labels=encode_labels(labels.numpy(), self.generator.num_classes))

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        outcome = StepOutcome(took_step=False)
        grads, attached, stats = [], [], []
        for reply in replies:
            accepted = self._accept(step, reply, outcome)
            if accepted is None:
                continue
            answer, grad = accepted
            grads.append(torch.from_numpy(grad))
            attached.append(self._attached[reply.node_id])
            stats.append(answer.stats)
        self._attached = {}
        if grads:
            # Divide by B and by the number of sampled clients m (DESIGN.md §2, step 5).
            self.generator.apply(attached, grads, divisor=self.cfg.batch_size * len(replies))
            self.steps_done += 1
            outcome.took_step = True
            outcome.metrics = _mean_stats(stats)
        return outcome

    def released_generator(self) -> nn.Module:
        return self.generator.ema.module

    # --- replies -------------------------------------------------------------------------------
    def _accept(self, step: int, reply: Incoming, outcome: StepOutcome) -> tuple[GsAnswer, np.ndarray] | None:
        """Validate one reply; record its privacy event; (answer, float32 gradients) or None when
        it cannot be used. The event is recorded whatever the gradients' wire encoding was."""
        if reply.content is None:
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} failed: {reply.error}")
            return None
        try:
            answer = decode_answer(reply.content)
            grad = validate_answer(answer, batch_size=self.cfg.batch_size, step=step)
        except PayloadError as err:
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} sent a malformed answer, ignored: {err}")
            return None
        self.node_client[reply.node_id] = answer.client_id
        if answer.refused:
            outcome.exhausted_nodes.append(reply.node_id)
            outcome.notes.append(answer.reason)
            return None
        ledger = self.ledgers.setdefault(answer.client_id, PrivacyLedger())
        ledger.record(PrivacyEvent(noise_multiplier=answer.noise_multiplier, sample_rate=answer.sample_rate))
        return answer, grad

    # --- end of run: the clients' own ledgers --------------------------------------------------
    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, MSG_LEDGER, encode_records({}, {})) for n in nodes]

    def absorb_ledgers(self, replies: list[Incoming]) -> list[str]:
        """Keep the clients' own ledgers; note where they disagree with the server's mirror."""
        notes = []
        for reply in replies:
            if reply.content is None:
                continue
            _, scalars = decode_records(reply.content)
            cid = int(scalars["client_id"])
            self.node_client[reply.node_id] = cid
            own = PrivacyLedger.from_state_dict(json.loads(str(scalars["ledger"])))
            self.authoritative[cid] = own
            seen = self.ledgers[cid].queries if cid in self.ledgers else 0
            if seen != own.queries:
                notes.append(f"client {cid}: its ledger holds {own.queries} queries, the server saw {seen} "
                             "answers (ε is reported from the client's ledger)")
        return notes

    # --- privacy -------------------------------------------------------------------------------
    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        """Per-client ε from the ledgers (authoritative ones when fetched), amplified ε beside it."""
        cfg = self.cfg
        clients = []
        for cid in range(cfg.num_clients):
            ledger = self._ledger_of(cid)
            entry = {"client_id": cid, "queries": ledger.queries,
                     "epsilon": ledger.epsilon(delta=cfg.delta)}
            if final:
                both = ledger.epsilon_both(delta=cfg.delta)
                entry["epsilon_prv"] = both.get("epsilon_prv")
                entry["ledger"] = ledger.state_dict()
            clients.append(entry)
        report = {
            "clients": clients,
            "epsilon_max": max(c["epsilon"] for c in clients),
            "accounting": ACCOUNTING_RULE_PER_CLIENT,
            "epsilon_amplified": self._amplified(),
        }
        if final:
            report["statement"] = privacy_statement(
                {c: self._ledger_of(c) for c in range(cfg.num_clients)}, delta=cfg.delta,
                clients_per_step=cfg.clients_per_step, num_clients=len(cfg.participants()),
                steps=self.steps_done, noise_multiplier=cfg.noise_multiplier, batch_size=cfg.batch_size)
        return report

    def _ledger_of(self, cid: int) -> PrivacyLedger:
        """The client's own ledger when fetched, else the server's mirror of it."""
        return self.authoritative.get(cid) or self.ledgers.get(cid) or _NO_RELEASES

    def _amplified(self) -> dict[str, Any]:
        cfg = self.cfg
        nm = query_noise_multiplier(noise_multiplier=cfg.noise_multiplier, batch_size=cfg.batch_size)
        q = cfg.clients_per_step / len(cfg.participants())
        return {
            "epsilon": amplified_epsilon(noise_multiplier=nm, sample_rate=q, steps=self.steps_done,
                                         delta=cfg.delta),
            "sample_rate": q,
            "steps": self.steps_done,
            "query_noise_multiplier": nm,
            "assumption": ACCOUNTING_RULE_AMPLIFIED,
        }

    # --- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "ledgers": {cid: led.state_dict() for cid, led in self.ledgers.items()},
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.ledgers = {int(c): PrivacyLedger.from_state_dict(s) for c, s in state["ledgers"].items()}
        self.steps_done = int(state["steps_done"])


def _mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*stats) if stats else set()
    return {f"train/{k}": sum(s.get(k, 0.0) for s in stats) / len(stats) for k in sorted(keys)}
