"""Centralized DPGAN (Bie, Kamath, Zhang 2023) as strategy hooks.

All partitions are pooled on one curator node (client 0), which trains D with DP-SGD and G by
post-processing, and returns G's weights every round; the server keeps the EMA (the released model),
checkpoints and reports like any other strategy. ε is example-level, from the node's own ledger of
the discriminator steps that added noise (Poisson sampling q = B/N; Opacus RDP, PRV beside it).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from client.flower_wire import decode_records, encode_records
from common.config import ExperimentConfig
from common.models import GeneratorEMA, build_generator
from common.privacy import PrivacyLedger

from .base import Incoming, Outgoing, StepOutcome, Strategy

MSG_ROUND = "train.dpgan"
CURATOR = 0
RULE = ("example-level DP-SGD on the discriminator (Opacus; Poisson sampling q = B/N, per-example "
        "clipping of real and fake rows to C, noise σC), composed over the discriminator steps that ran; "
        "generator steps are post-processing; Opacus RDP accountant (PRV beside it)")


class DpganStrategy(Strategy):
    name = "dpgan"

    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.ledger = PrivacyLedger()
        self.rounds_done = 0
        self.last: dict[str, Any] = {}
        self.node_client = {}

    def select_nodes(self, available: list[int]) -> list[int]:
        return [n for n in available if self.node_client.get(n) == CURATOR][:1]

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, MSG_ROUND, encode_records({}, {"step": step})) for n in nodes]

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        outcome = StepOutcome(took_step=False)
        for reply in replies:
            if reply.content is None:
                outcome.failed_nodes.append(reply.node_id)
                outcome.notes.append(f"the DPGAN node failed: {reply.error}")
                continue
            scalars = decode_records(reply.content)[1]
            if scalars["refused"]:
                outcome.exhausted_nodes.append(reply.node_id)
                outcome.notes.append(str(scalars["reason"]))
                continue
            self.generator.load_state_dict(reply.content.array_records["generator"].to_torch_state_dict())
            self.ema.update(self.generator)
            self.ledger = PrivacyLedger.from_state_dict(json.loads(str(scalars["ledger"])))
            self.last = {k: scalars[k] for k in ("noise_multiplier", "sample_rate", "n_d", "discriminator_steps")}
            self.rounds_done += 1
            outcome.took_step = True
            stats = reply.content.config_records["stats"] if "stats" in reply.content else {}
            outcome.metrics = {f"train/{k}": float(v) for k, v in stats.items()}
            outcome.metrics["train/n_d"] = float(scalars["n_d"])
        return outcome

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        entry = {"client_id": CURATOR, "queries": self.ledger.queries,
                 "epsilon": self.ledger.epsilon(delta=self.cfg.delta)}
        if final:
            entry["epsilon_prv"] = self.ledger.epsilon_both(delta=self.cfg.delta).get("epsilon_prv")
            entry["ledger"] = self.ledger.state_dict()
        return {
            "clients": [entry],
            "epsilon_max": entry["epsilon"],
            "accounting": RULE,
            "statement": (f"Privacy statement (δ = {self.cfg.delta:g}). Centralized DPGAN: every training "
                          f"example is protected at ε = {entry['epsilon']:.4g} (RDP) by DP-SGD on the "
                          f"discriminator over {self.ledger.queries} noisy steps "
                          f"(σ = {self.last.get('noise_multiplier', self.cfg.dpgan_noise_multiplier)}, "
                          f"q = {self.last.get('sample_rate', float('nan')):.4g}). This assumes the curator "
                          "node that pools the data is trusted."),
            "epsilon_amplified": {
                "epsilon": None,
                "assumption": "not applicable: the curator node does its own Poisson sampling, already "
                              "included in the example-level ε",
            },
            "summary_extra": {
                "sample_rate": self.last.get("sample_rate"),
                "discriminator_steps": self.last.get("discriminator_steps", 0),
                "noise_multiplier": self.last.get("noise_multiplier", self.cfg.dpgan_noise_multiplier),
                "target_epsilon": self.cfg.target_epsilon or None,
                "n_d": self.last.get("n_d", self.cfg.dpgan_n_d),
            },
        }

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.state_dict(), "ema": self.ema.state_dict(),
                "ledger": self.ledger.state_dict(), "rounds_done": self.rounds_done, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.ema.load_state_dict(state["ema"])
        self.ledger = PrivacyLedger.from_state_dict(state["ledger"])
        self.rounds_done = int(state["rounds_done"])
        self.last = dict(state["last"])
