"""Centralized DPGAN's server side, wire-free.

All partitions are pooled on one curator node (client 0), which trains D with DP-SGD and G by
post-processing, and returns G's weights every round; the server keeps the EMA (the released model),
checkpoints and reports like any other method. ε is example-level, from the curator's own ledger
of the discriminator steps that added noise (secret Poisson sampling q = B/N; Opacus RDP, PRV beside
it). The server's record charges the round's planned steps when it is sent, and takes the node's
ledger from every reply and at the end of the run; the larger is reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from common.device import resolve_device
from common.learning.models import GeneratorEMA, build_generator
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.records import LedgerClaim
from common.privacy.sampling import VOID_SAMPLING_SEED
from common.privacy.statement import KIND_EXAMPLE

from ..base import NOT_APPLICABLE, ServerBase
from ..protocol import Reply, StepOutcome
from ..seeding import seeded
from ..seeding.pooled import RULE_POOLED_SEED, seed_event
from .curator import CURATOR
from .messages import DpganReply, DpganRound
from .privacy import RULE_DPGAN, rule, statement

if TYPE_CHECKING:
    from common.methods import ExperimentConfig


class DpganServer(ServerBase):
    epsilon_kind = KIND_EXAMPLE
    accounting = RULE_DPGAN

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        super().__init__(cfg)
        self.accounting = rule(cfg)
        torch.manual_seed(cfg.seed)
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.generator.to(resolve_device(cfg.device))
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.rounds_done = 0
        self.last: dict[str, Any] = {}

    def _is_curator(self, node: int) -> bool:
        return self.node_client.get(node) == CURATOR

    # --- a round ---------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        return [n for n in available if self._is_curator(n)][:1]

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, DpganRound]]:
        for _ in nodes:  # the round's planned steps, charged before the node runs them
            if self.rounds_done == 0 and seeded(self.cfg):  # the curator's seed release comes first
                self.records.charge(CURATOR, seed_event(self.cfg))
            self.records.charge(CURATOR, self._planned())
        return [(n, DpganRound(step=step)) for n in nodes]

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

    def expectations(self, step: int) -> dict[str, Any]:
        """G's entries, shapes and dtypes: a generator that cannot be G is a malformed reply."""
        return {"step": step, "like": self.generator.state_dict()}

    def on_refused(self, reply: Reply) -> None:
        self.records.settle(CURATOR)  # a refused round released nothing

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> DpganReply:
        """The curator's round: its G (the EMA follows), its ledger, its statistics on fakes."""
        answer: DpganReply = reply.payload
        self.generator.load_state_dict(answer.generator)
        if self.rounds_done == 0 and seeded(self.cfg):  # the EMA starts from the G fitted to the seed
            self.ema = GeneratorEMA(self.generator, decay=self.cfg.ema_decay)
        else:
            self.ema.update(self.generator)
        outcome.notes += self.records.absorb(self.node_client, [LedgerClaim(reply.node, answer.ledger)], final=False)
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
        return answer

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        """Nothing more: the curator's reply was the round."""

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def ledger_nodes(self, nodes: list[int]) -> list[int]:
        """Only the curator released anything."""
        return [n for n in nodes if self._is_curator(n)]

    # --- the report ------------------------------------------------------------------------------
    def headline_ledgers(self, *, final: bool = True) -> dict[int, PrivacyLedger]:
        return {CURATOR: self.records.ledger_of(CURATOR)}

    def stage_shares(self, ledgers: dict[int, PrivacyLedger], clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A seeded run's shares in the curator's ledger: its first entry (the seed release), the
        DP-SGD steps after it, and the total (the headline, both composed)."""
        ledger = ledgers[CURATOR]
        if not seeded(self.cfg) or not ledger.history:
            return []
        delta, history = self.cfg.delta, ledger.history
        rest = PrivacyLedger(history[1:])
        shares = [
            ("seed", self.cfg.init_release, PrivacyLedger(history[:1]), RULE_POOLED_SEED),
            ("refinement", self.cfg.strategy, rest, f"{RULE_DPGAN}; its steps alone"),
            (
                "total",
                f"{self.cfg.init_release} then {self.cfg.strategy}",
                ledger,
                "both composed in the curator's one ledger",
            ),
        ]
        return [
            {
                "stage": stage,
                "method": name,
                "epsilon_max": part.epsilon(delta=delta) if part.queries else 0.0,
                "accounting": how,
                "releases": part.queries,
            }
            for stage, name, part, how in shares
        ]

    def beside(self, *, final: bool) -> dict[str, Any]:
        return {
            **NOT_APPLICABLE,
            "assumption": "not applicable: the curator node does its own Poisson sampling, already "
            "included in the example-level ε",
        }

    def mechanism(self) -> dict[str, float]:
        cfg = self.cfg
        return {
            "B": cfg.dpgan_batch_size,
            "σ": self.last.get("noise_multiplier", cfg.dpgan_noise_multiplier),
            "C": cfg.dpgan_clip,
            "q": self.last.get("sample_rate") or 0.0,
            **({"σ_s": cfg.init_noise_multiplier} if seeded(cfg) else {}),
        }

    def parameters(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "sample_rate": self.last.get("sample_rate"),
            "discriminator_steps": self.records.ledger_of(CURATOR).queries,
            "noise_multiplier": self.last.get("noise_multiplier", cfg.dpgan_noise_multiplier),
            "target_epsilon": cfg.target_epsilon or None,
            "n_d": self.last.get("n_d", cfg.dpgan_n_d),
        }

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        return statement(self.cfg, ledgers[CURATOR])

    # --- checkpoint ------------------------------------------------------------------------------
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
