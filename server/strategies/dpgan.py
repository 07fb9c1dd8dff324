"""Centralized DPGAN's Flower strategy: a thin adapter over its core (``common/methods/dpgan.py``).

All partitions are pooled on one curator node (client 0), which trains D with DP-SGD and G by
post-processing, and returns G's weights every round; the server keeps the EMA (the released model),
checkpoints and reports like any other strategy. ε is example-level, from the curator's own ledger
of the discriminator steps that added noise (secret Poisson sampling q = B/N; Opacus RDP, PRV beside
it). The server's record charges the round's planned steps when it is sent, and takes the node's
ledger from every reply and at the end of the run; the larger is reported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from common.codec import PayloadError
from common.config import ExperimentConfig
from common.device import resolve_device
from common.messages import LEDGER, LedgerQuery
from common.methods.dpgan import CURATOR, MSG_ROUND, DpganReply, DpganRound
from common.models import GeneratorEMA, build_generator
from common.privacy import PrivacyEvent
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.sampling import VOID_SAMPLING_SEED
from common.privacy.statement import (
    KIND_EXAMPLE,
    RULE_DPGAN,
    client_entry,
    dpgan_statement,
    grouping_sentence,
    not_private_reasons,
)
from protos import wire

from .base import Incoming, Outgoing, StepOutcome, Strategy
from .records import ClientRecords


class DpganStrategy(Strategy):
    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.generator.to(resolve_device(cfg.device))
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.records = ClientRecords(cfg.delta)
        self.rounds_done = 0
        self.last: dict[str, Any] = {}
        self.node_client = {}

    def select_nodes(self, available: list[int]) -> list[int]:
        return [n for n in available if self.node_client.get(n) == CURATOR][:1]

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        for _ in nodes:  # the round's planned steps, charged before the node runs them
            self.records.charge(CURATOR, self._planned())
        return [Outgoing(n, MSG_ROUND, wire.encode(DpganRound(step=step))) for n in nodes]

    def _planned(self) -> PrivacyEvent:
        """n_D DP-SGD steps at the σ and q the node reported last (the configured ones before)."""
        cfg = self.cfg
        q = self.last.get("sample_rate") or 1.0  # unknown before the first reply: no amplification assumed
        void = VOID_NOISE_SEED if cfg.noise_seed >= 0 else (VOID_SAMPLING_SEED if cfg.sampling_seed >= 0 else "")
        return PrivacyEvent(
            noise_multiplier=float(self.last.get("noise_multiplier", cfg.dpgan_noise_multiplier)),
            sample_rate=float(q),
            count=int(self.last.get("n_d", cfg.dpgan_n_d)),
            sampling="poisson",
            void=void,
        )

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        outcome = StepOutcome(took_step=False)
        for reply in replies:
            if reply.content is None:
                outcome.failed_nodes.append(reply.node_id)
                outcome.notes.append(f"the DPGAN node failed: {reply.error}")
                continue
            try:
                answer = wire.decode(DpganReply, reply.content, step=step, like=self.generator.state_dict())
            except PayloadError as err:  # charged when sent; G, its EMA and the records stay as they were
                outcome.failed_nodes.append(reply.node_id)
                outcome.notes.append(f"the DPGAN node sent a malformed reply, ignored: {err}")
                continue
            if answer.refused:
                self.records.settle(CURATOR)  # a refused round released nothing
                outcome.exhausted_nodes.append(reply.node_id)
                outcome.notes.append(answer.reason)
                continue
            self._take(answer, reply, outcome)
        return outcome

    def _take(self, answer: DpganReply, reply: Incoming, outcome: StepOutcome) -> None:
        """The curator's round: its G (the EMA follows), its ledger, its statistics on fakes."""
        self.generator.load_state_dict(answer.generator)
        self.ema.update(self.generator)
        outcome.notes += self.records.absorb(self.node_client, [reply], final=False)
        self.records.settle(CURATOR)  # the reply's ledger covers every step up to this round
        self.last = {
            "noise_multiplier": answer.noise_multiplier,
            "sample_rate": answer.sample_rate,
            "n_d": answer.n_d,
            "discriminator_steps": answer.discriminator_steps,
        }
        self.rounds_done += 1
        outcome.took_step = True
        outcome.metrics = {f"train/{k}": v for k, v in answer.stats.items()}
        outcome.metrics["train/n_d"] = float(answer.n_d)

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, LEDGER, wire.encode(LedgerQuery())) for n in nodes if self.node_client.get(n) == CURATOR]

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        return self.records.absorb(self.node_client, replies, final=final)

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        ledger = self.records.ledger_of(CURATOR)
        entry = client_entry(CURATOR, ledger, delta=cfg.delta, accountant=cfg.accountant, final=final)
        report = {
            "clients": [entry],
            "epsilon_max": entry["epsilon"],
            "epsilon_kind": KIND_EXAMPLE,
            "accounting": RULE_DPGAN,
            "not_private": not_private_reasons([ledger]),
            "mechanism": {
                "B": cfg.dpgan_batch_size,
                "σ": self.last.get("noise_multiplier", cfg.dpgan_noise_multiplier),
                "C": cfg.dpgan_clip,
                "q": self.last.get("sample_rate") or 0.0,
            },
            "epsilon_amplified": {
                "epsilon": None,
                "epsilon_reason": "not applicable",
                "kind": "",
                "assumption": "not applicable: the curator node does its own Poisson sampling, already "
                "included in the example-level ε",
            },
            "summary_extra": {
                "sample_rate": self.last.get("sample_rate"),
                "discriminator_steps": ledger.queries,
                "noise_multiplier": self.last.get("noise_multiplier", cfg.dpgan_noise_multiplier),
                "target_epsilon": cfg.target_epsilon or None,
                "n_d": self.last.get("n_d", cfg.dpgan_n_d),
            },
        }
        if final:
            report["statement"] = dpgan_statement(
                ledger,
                delta=cfg.delta,
                accountant=cfg.accountant,
                dpac_beta=cfg.dpac_beta,
                grouping=grouping_sentence(cfg),
            )
        return report

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "ema": self.ema.state_dict(),
            "records": self.records.state_dict(),
            "rounds_done": self.rounds_done,
            "last": self.last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.ema.load_state_dict(state["ema"])
        if "records" in state:
            self.records.load_state_dict(state["records"])
        else:  # a checkpoint from before the records: the node's ledger as the last reply carried it
            self.records.load_state_dict({"own": {CURATOR: state["ledger"]}})
        self.rounds_done = int(state["rounds_done"])
        self.last = dict(state["last"])
