"""Fed-Avg GAN (Augenstein et al. 2020) as strategy hooks: user-level DP-FedAvg on the discriminator.

Per round: sample m clients, send G and D; each returns its D delta after a few local WGAN-GP SGD
steps; the server clips each delta to S, sums, adds N(0, (zS)^2), divides by the fixed m, applies it,
then takes a few generator steps against the new D. The server sees raw deltas: against an untrusted
server the per-client ε is unbounded (reported as null with the reason); the amplified ε assumes a
trusted server that samples uniformly.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord
from torch import nn

from client.flower_wire import decode_records, encode_records
from common.config import ExperimentConfig
from common.fedavg_gan import ACCOUNTING_RULE_FEDAVG, aggregate_deltas, apply_delta, fedavg_epsilon, server_generator_steps
from common.models import GeneratorEMA, build_discriminator, build_generator
from common.privacy import noise_generator

from .base import Incoming, Outgoing, StepOutcome, Strategy

MSG_ROUND = "train.fedavg"
UNBOUNDED_REASON = ("Fed-Avg GAN releases raw discriminator deltas to the server; against an untrusted "
                    "server a client's ε is unbounded")


class FedAvgGanStrategy(Strategy):
    name = "fedavg-gan"

    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.num_classes = cfg, num_classes
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.discriminator = build_discriminator(cfg.model, num_classes=num_classes)
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.rounds_done = 0
        self.participation: dict[int, int] = {}
        self.node_client = {}

    def _noise(self) -> torch.Generator:
        seed = None if self.cfg.noise_seed < 0 else self.cfg.noise_seed * 7_919 + self.rounds_done
        return noise_generator(seed)

    def select_nodes(self, available: list[int]) -> list[int]:
        m = min(self.cfg.fedavg_clients_per_round, len(available))
        order = torch.randperm(len(available), generator=self.rng)[:m]
        return [available[i] for i in order.tolist()]

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        out = []
        g_state = ArrayRecord(self.generator.state_dict())
        d_state = ArrayRecord(self.discriminator.state_dict())
        for node in nodes:
            content = encode_records({}, {"step": step, "seed": int(torch.randint(2**31, (1,), generator=self.rng))})
            content["generator"], content["discriminator"] = g_state, d_state
            out.append(Outgoing(node, MSG_ROUND, content))
        return out

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        outcome = StepOutcome(took_step=False)
        deltas = []
        for reply in replies:
            if reply.content is None:
                outcome.failed_nodes.append(reply.node_id)
                outcome.notes.append(f"node {reply.node_id} failed: {reply.error}")
                continue
            cid = int(decode_records(reply.content)[1]["client_id"])
            self.participation[cid] = self.participation.get(cid, 0) + 1
            deltas.append(reply.content.array_records["delta"].to_torch_state_dict())
        if not deltas:
            return outcome
        try:
            update, _ = aggregate_deltas(deltas, clip_norm=self.cfg.fedavg_clip,
                                         noise_multiplier=self.cfg.fedavg_noise_multiplier,
                                         num_sampled=len(replies), generator=self._noise())
        except ValueError as err:
            outcome.notes.append(f"round {step} dropped: {err}")
            return outcome
        apply_delta(self.discriminator, update)
        stats = server_generator_steps(self.generator, self.discriminator, steps=self.cfg.server_g_steps,
                                       lr=self.cfg.fedavg_lr_g, batch_size=self.cfg.batch_size,
                                       z_dim=self.cfg.z_dim, num_classes=self.num_classes, generator=self.rng)
        self.ema.update(self.generator)
        self.rounds_done += 1
        outcome.took_step = True
        outcome.metrics = {f"train/{k}": float(v) for k, v in stats.items()}
        return outcome

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        eps = fedavg_epsilon(noise_multiplier=cfg.fedavg_noise_multiplier,
                             clients_per_round=cfg.fedavg_clients_per_round,
                             num_clients=len(cfg.participants()), rounds=self.rounds_done, delta=cfg.delta)
        clients = [{"client_id": c, "queries": self.participation.get(c, 0), "epsilon": None,
                    "epsilon_reason": UNBOUNDED_REASON, "epsilon_prv": None}
                   for c in range(cfg.num_clients)]
        amplified = "unbounded (z = 0)" if eps["epsilon"] is None else f"ε = {eps['epsilon']:.4g}"
        statement = (f"Privacy statement (δ = {cfg.delta:g}). Fed-Avg GAN, user-level DP-FedAvg: each round "
                     f"every sampled client's discriminator delta is clipped to L2 norm S = {cfg.fedavg_clip} "
                     f"and the server adds Gaussian noise of std zS (z = {cfg.fedavg_noise_multiplier}) to "
                     f"their sum. With a trusted server sampling {cfg.fedavg_clients_per_round} of "
                     f"{len(cfg.participants())} clients uniformly, {amplified} after {self.rounds_done} "
                     f"rounds. {UNBOUNDED_REASON}: no per-client guarantee holds against the server.")
        return {
            "clients": clients,
            "statement": statement,
            "epsilon_max": None,
            "accounting": ("per-client, untrusted server: unbounded (raw deltas are visible to the server); "
                           "see epsilon_amplified for the user-level DP-FedAvg guarantee with a trusted server"),
            "epsilon_amplified": {
                "epsilon": eps["epsilon"],
                "sample_rate": cfg.fedavg_clients_per_round / len(cfg.participants()),
                "steps": self.rounds_done,
                "query_noise_multiplier": cfg.fedavg_noise_multiplier,
                "assumption": ACCOUNTING_RULE_FEDAVG,
            },
        }

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.state_dict(), "discriminator": self.discriminator.state_dict(),
                "ema": self.ema.state_dict(), "rng": self.rng.get_state(), "rounds_done": self.rounds_done,
                "participation": dict(self.participation)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.ema.load_state_dict(state["ema"])
        self.rng.set_state(state["rng"])
        self.rounds_done = int(state["rounds_done"])
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
