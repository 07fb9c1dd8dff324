"""GS-WGAN's Flower strategy: a thin adapter over its core (``common/methods/gswgan.py``).

Per generator step: draw m of the K_t clients still available, uniformly without replacement and in
secret (``Sampler``), send each (n_critic+1)*B generated samples with server-drawn labels (only the
B queried ones when clients reuse fakes for their critic steps, ``critic_fakes``), receive B
sanitized per-sample gradients from each, divide by B*m, and let the core's ``ServerGenerator``
backpropagate them (straight-through at G's unquantized output), step Adam and update the EMA.

Privacy records, all ledgers (``common/privacy``):
- ``server_ledger``: one without-replacement event per step at the rate that actually ran,
  q_t = m/K_t, recorded when the sample is drawn: the amplified (trusted-sampling) figure;
- ``records``: the server's record of each client, charged when a query is sent (kept when the
  reply is lost, withdrawn only on an explicit refusal, which releases nothing), and the clients'
  own ledgers; reports keep the larger (``records.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from common.codec import GsAnswer, GsQuery, PayloadError, encode_labels, encode_samples
from common.config import ExperimentConfig
from common.messages import LEDGER, LedgerQuery
from common.methods.gswgan import MSG_QUERY, ServerGenerator, implausible_norms, planned_event
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler
from common.privacy.statement import (
    KIND_AMPLIFIED,
    KIND_PER_CLIENT,
    RULE_AMPLIFIED_WOR,
    RULE_PER_CLIENT,
    client_entry,
    gswgan_statement,
    max_epsilon,
    not_private_reasons,
    server_entry,
)
from protos import wire

from .base import Incoming, Outgoing, PriorReleases, StepOutcome, Strategy
from .records import ClientRecords


class GsWganStrategy(Strategy):
    def __init__(
        self, cfg: ExperimentConfig, num_classes: int, state_dir: str, prior: PriorReleases | None = None
    ) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.generator = ServerGenerator(cfg, num_classes)
        self.sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
        self.prior = prior or PriorReleases()
        self.records = ClientRecords(cfg.delta, self.prior.clients)
        self.server_ledger = PrivacyLedger(self.prior.server)
        self.node_client: dict[int, int] = {}
        self.steps_done = 0
        self._attached: dict[int, torch.Tensor] = {}
        self._sent: dict[int, PrivacyEvent] = {}
        self.planned = planned_event(cfg, cfg.batch_size)

    # --- hooks ---------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """m of the available nodes, uniformly without replacement, from the secret sampler; the
        server's ledger records the draw at the rate that actually ran (q_t = m/K_t)."""
        chosen = self.sampler.choose(available, self.cfg.clients_per_step)
        void = self.sampler.void_reason or self.planned.void
        self.server_ledger.record(
            PrivacyEvent(
                noise_multiplier=self.planned.noise_multiplier,
                sample_rate=len(chosen) / len(available),
                sampling="wor",
                population=len(available),
                void=void,
            )
        )
        return chosen

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        if not self.generator.public_warmed:
            self.generator.public_warm_start()
        out = []
        self._attached, self._sent = {}, {}
        for node in nodes:
            fakes, labels, attached = self.generator.query_batches(self.cfg.batch_size, self._critic_batches())
            self._attached[node] = attached
            self._sent[node] = self.planned
            out.append(Outgoing(node, MSG_QUERY, wire.encode(self._query(step, fakes, labels))))
        return out

    def _critic_batches(self) -> int:
        """Critic batches sent along with the queried one: none when clients reuse fakes."""
        return self.cfg.n_critic if self.cfg.critic_fakes == "fresh" else 0

    def _query(self, step: int, fakes: torch.Tensor, labels: torch.Tensor) -> GsQuery:
        """Samples and labels in their wire encodings (the samples are public: any encoding is fine)."""
        fake, encoding = encode_samples(
            fakes.numpy(), self.cfg.wire_samples, compress=self.cfg.wire_compression == "deflate"
        )
        return GsQuery(
            step=step,
            batch_size=self.cfg.batch_size,
            fake=fake,
            fake_encoding=encoding,
            labels=encode_labels(labels.numpy(), self.generator.num_classes),
        )

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
            stats.append(requested_stats(answer.stats, self.cfg.client_stats))
        self._attached, self._sent = {}, {}
        if grads:
            # Divide by B and by the number of sampled clients m (DESIGN.md §2, step 5).
            if self.generator.apply(attached, grads, divisor=self.cfg.batch_size * len(replies)):
                self.steps_done += 1
                outcome.took_step = True
                outcome.metrics = _mean_stats(stats)
            else:
                outcome.notes.append(f"step {step}: the generator's gradient was not finite; step skipped")
        return outcome

    def released_generator(self) -> nn.Module:
        return self.generator.ema.module

    # --- replies -------------------------------------------------------------------------------
    def _charge(self, node: int, event: PrivacyEvent) -> None:
        self.records.charge(self.node_client.get(node, -1), event)

    def _accept(self, step: int, reply: Incoming, outcome: StepOutcome) -> tuple[GsAnswer, np.ndarray] | None:
        """Validate one reply and charge the server's record; (answer, float32 gradients) or None.

        The query was charged when it was sent: a lost or malformed reply keeps that charge (the
        client may have answered, and charged itself, anyway); only an explicit refusal, which
        carries no release, withdraws it. Identity is the node's, learned at the hello."""
        planned = self._sent.get(reply.node_id, self.planned)
        if reply.content is None:
            self._charge(reply.node_id, planned)
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} failed: {reply.error}")
            return None
        try:
            answer = wire.decode(
                GsAnswer, reply.content, batch_size=self.cfg.batch_size, step=step, coords=self.cfg.grad_dct**2
            )
        except PayloadError as err:
            self._charge(reply.node_id, planned)
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} sent a malformed answer, ignored: {err}")
            return None
        if answer.refused:
            outcome.exhausted_nodes.append(reply.node_id)
            outcome.notes.append(answer.reason)
            return None
        # The smaller noise multiplier of what was asked and what the client says it ran.
        nm = min(planned.noise_multiplier, answer.noise_multiplier)
        self._charge(reply.node_id, PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=planned.void))
        implausible = implausible_norms(answer.grad, self.cfg)
        if implausible:  # charged (it was released), but not applied
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} sent an answer no honest client sends, ignored: {implausible}")
            return None
        return answer, answer.grad

    # --- the clients' own ledgers --------------------------------------------------------------
    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, LEDGER, wire.encode(LedgerQuery())) for n in nodes]

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        return self.records.absorb(self.node_client, replies, final=final)

    # --- privacy -------------------------------------------------------------------------------
    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        """Per-client ε from the clients' ledgers, the amplified ε from the server's, beside it."""
        cfg = self.cfg
        ledgers = self.records.ledgers(range(cfg.num_clients))
        clients = [
            client_entry(cid, ledger, delta=cfg.delta, accountant=cfg.accountant, final=final)
            for cid, ledger in ledgers.items()
        ]
        report = {
            "clients": clients,
            "epsilon_max": max_epsilon(clients),
            "epsilon_kind": KIND_PER_CLIENT,
            "accounting": RULE_PER_CLIENT,
            "epsilon_amplified": server_entry(
                self.server_ledger,
                delta=cfg.delta,
                accountant=cfg.accountant,
                kind=KIND_AMPLIFIED,
                rule=RULE_AMPLIFIED_WOR,
                final=final,
            ),
            # The per-client headline's: a void server ledger (--sampling-seed) voids only the amplified
            # figure, whose own epsilon_reason says so.
            "not_private": not_private_reasons(ledgers.values()),
            "mechanism": {
                "B": cfg.batch_size,
                "σ": cfg.noise_multiplier,
                "C": cfg.clip,
                "m per step": cfg.clients_per_step,
            },
        }
        if final:
            report["statement"] = gswgan_statement(
                ledgers,
                self.server_ledger,
                delta=cfg.delta,
                accountant=cfg.accountant,
                noise_multiplier=cfg.noise_multiplier,
                batch_size=cfg.batch_size,
                prior=self.prior.description,
                warmup_steps=cfg.warmup_steps,
                grad_dct=cfg.grad_dct,
                dpac_beta=cfg.dpac_beta,
            )
        return report

    # --- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "records": self.records.state_dict(),
            "server_ledger": self.server_ledger.state_dict(),
            "sampler": self.sampler.state_dict(),
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.steps_done = int(state["steps_done"])
        # "ledgers": checkpoints made before the records and the server's ledger existed
        self.records.load_state_dict(state.get("records", {"charged": state.get("ledgers", {})}))
        if "server_ledger" in state:
            self.server_ledger = PrivacyLedger.from_state_dict(state["server_ledger"])
        else:  # its sampling was not recorded: claim no amplification for those steps (conservative)
            self.server_ledger = PrivacyLedger([self.planned.times(self.steps_done)] if self.steps_done else [])
        self.sampler.load_state_dict(state.get("sampler", {}))


CLIENT_STAT_KEYS = 16  # what --client-stats sends: the critic's statistics and two gradient figures


def requested_stats(stats: dict[str, float], asked: bool) -> dict[str, float]:
    """The statistics the run asked for: none without --client-stats (a client sending them anyway is
    ignored), else at most CLIENT_STAT_KEYS short names."""
    if not asked:
        return {}
    return {k[:40]: v for k, v in sorted(stats.items())[:CLIENT_STAT_KEYS]}


def _mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*stats) if stats else set()
    return {f"train/{k}": sum(s.get(k, 0.0) for s in stats) / len(stats) for k in sorted(keys)}
