"""Fed-Avg GAN's Flower strategy: a thin adapter over its core (``common/methods/fedavg_gan.py``).

Per round: sample every available client independently with probability q = m/K (secret, Poisson),
send G and D to those sampled; each returns its D delta after a few local WGAN-GP SGD steps; the
server clips each delta to S, sums, adds N(0, (zS)^2), divides by the fixed m = qK, applies it
(``common/dp_fedavg.py``), then takes a few generator steps against the new D.

Privacy records (ledgers): the server's ledger holds one Poisson-subsampled Gaussian event (z, q)
per round that released a noised D: the user-level figure with a trusted server. The server sees
raw deltas, so each client's own ledger (and the server's record of it, charged when D is sent)
holds a void event per delta: its ε against an untrusted server is unbounded, null with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from common.codec import PayloadError
from common.config import ExperimentConfig
from common.device import resolve_device
from common.dp_fedavg import aggregate_deltas, apply_delta, flatten_delta
from common.messages import LEDGER, LedgerQuery
from common.methods.fedavg_gan import MSG_ROUND, RAW_DELTA, FedAvgReply, FedAvgRound, server_generator_steps
from common.models import GeneratorEMA, build_discriminator, build_generator, on_cpu
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler, noise_generator
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.statement import (
    KIND_PER_CLIENT,
    KIND_USER,
    RULE_FEDAVG_UNTRUSTED,
    RULE_FEDAVG_USER,
    client_entry,
    fedavg_statement,
    max_epsilon,
    not_private_reasons,
    server_entry,
)
from common.public_warmup import warm_gan_on_public
from protos import wire

from .base import Incoming, Outgoing, StepOutcome, Strategy
from .records import ClientRecords


class FedAvgGanStrategy(Strategy):
    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.num_classes = cfg, num_classes
        device = resolve_device(cfg.device)
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes).to(device)
        self.discriminator = build_discriminator(cfg.model, num_classes=num_classes).to(device)
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.rng = torch.Generator().manual_seed(cfg.seed)  # public: latents, labels, clients' data order
        self.sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
        self.population = len(cfg.participants())
        self.sample_rate = min(1.0, cfg.fedavg_clients_per_round / self.population)
        self.server_ledger = PrivacyLedger()
        self.records = ClientRecords(cfg.delta)
        self.rounds_done = 0
        self.node_client = {}
        self.public_warmed = not cfg.public_warmup_steps

    def _public_warm_start(self) -> None:
        """dpGAN's warm start on the public data: the server's G and the first global D (the clients'
        WGAN-GP loss), before the first round; the EMA restarts from the warmed G."""
        self.ema = warm_gan_on_public(
            self.generator, self.discriminator, self.cfg, num_classes=self.num_classes, rng=self.rng
        )
        self.public_warmed = True

    def _noise(self) -> torch.Generator:
        seed = None if self.cfg.noise_seed < 0 else self.cfg.noise_seed * 7_919 + self.rounds_done
        return noise_generator(seed)

    def _void(self) -> str:
        """Why this run's user-level figure is not private ("" when the sampling and noise are secret)."""
        return self.sampler.void_reason or (VOID_NOISE_SEED if self.cfg.noise_seed >= 0 else "")

    def select_nodes(self, available: list[int]) -> list[int]:
        """Every available node independently with probability q = m/K (possibly none)."""
        return [available[i] for i in self.sampler.poisson(len(available), self.sample_rate).tolist()]

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        if not self.public_warmed:
            self._public_warm_start()
        out = []
        g_state, d_state = (on_cpu(m.state_dict()) for m in (self.generator, self.discriminator))
        for node in nodes:
            seed = int(torch.randint(2**31, (1,), generator=self.rng))
            round_ = FedAvgRound(step=step, seed=seed, generator=g_state, discriminator=d_state)
            out.append(Outgoing(node, MSG_ROUND, wire.encode(round_)))
            self.records.charge(self.node_client.get(node, -1), RAW_DELTA)
        return out

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        """Clip, sum, noise, divide by m, apply; then the generator steps. Every round releases a
        noised D, also one whose sampled clients all failed or that sampled nobody."""
        outcome = StepOutcome(took_step=False)
        state = self.discriminator.state_dict()
        template = flatten_delta(state, state)
        shapes = {name: tuple(t.shape) for name, t in template.items()}
        deltas = [d for d in (self._accept(step, r, shapes, outcome) for r in replies) if d is not None]
        try:
            update, info = aggregate_deltas(
                deltas,
                template=template,
                clip_norm=self.cfg.fedavg_clip,
                noise_multiplier=self.cfg.fedavg_noise_multiplier,
                num_sampled=self.cfg.fedavg_clients_per_round,
                generator=self._noise(),
            )
        except ValueError as err:  # cannot happen after _accept; if it does: no release, nothing to account
            outcome.notes.append(f"round {step} dropped: {err}")
            return outcome
        self.server_ledger.record(info.privacy_event(num_clients=self.population, void=self._void()))
        apply_delta(self.discriminator, update)
        stats = server_generator_steps(
            self.generator,
            self.discriminator,
            steps=self.cfg.server_g_steps,
            lr=self.cfg.fedavg_lr_g,
            batch_size=self.cfg.batch_size,
            z_dim=self.cfg.z_dim,
            num_classes=self.num_classes,
            generator=self.rng,
        )
        self.ema.update(self.generator)
        self.rounds_done += 1
        outcome.took_step = True
        outcome.metrics = {f"train/{k}": float(v) for k, v in stats.items()}
        outcome.metrics["train/clients_sampled"] = float(len(replies))
        return outcome

    def _accept(
        self, step: int, reply: Incoming, shapes: dict[str, tuple[int, ...]], outcome: StepOutcome
    ) -> dict[str, torch.Tensor] | None:
        """The reply's delta, or None with its sender marked failed: a lost reply, or one that does
        not decode or does not fit D. Either contributes nothing to the round's sum, as a client
        that was not sampled (the sum's sensitivity is S per client whatever the others sent), so
        the honest deltas of the round are kept; the sender stays charged for what it was sent."""
        if reply.content is None:
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} failed: {reply.error}")
            return None
        try:
            return wire.decode(FedAvgReply, reply.content, step=step, shapes=shapes).delta
        except PayloadError as err:
            cid = self.node_client.get(reply.node_id, -1)
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} (client {cid}) sent a malformed delta, ignored: {err}")
            return None

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, LEDGER, wire.encode(LedgerQuery())) for n in nodes]

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        return self.records.absorb(self.node_client, replies, final=final)

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]:
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
            "accounting": RULE_FEDAVG_UNTRUSTED,
            "epsilon_amplified": server_entry(
                self.server_ledger,
                delta=cfg.delta,
                accountant=cfg.accountant,
                kind=KIND_USER,
                rule=RULE_FEDAVG_USER,
                final=final,
            ),
            "not_private": not_private_reasons([self.server_ledger]),
            "mechanism": {
                "S": cfg.fedavg_clip,
                "z": cfg.fedavg_noise_multiplier,
                "expected m per round": cfg.fedavg_clients_per_round,
                "q": self.sample_rate,
            },
        }
        if final:
            report["statement"] = fedavg_statement(
                ledgers,
                self.server_ledger,
                delta=cfg.delta,
                accountant=cfg.accountant,
                clip=cfg.fedavg_clip,
                noise_multiplier=cfg.fedavg_noise_multiplier,
            )
        return report

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "discriminator": self.discriminator.state_dict(),
            "ema": self.ema.state_dict(),
            "rng": self.rng.get_state(),
            "rounds_done": self.rounds_done,
            "server_ledger": self.server_ledger.state_dict(),
            "records": self.records.state_dict(),
            "sampler": self.sampler.state_dict(),
            "public_warmed": self.public_warmed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.ema.load_state_dict(state["ema"])
        self.rng.set_state(state["rng"])
        self.rounds_done = int(state["rounds_done"])
        self.records.load_state_dict(state.get("records", {}))
        self.sampler.load_state_dict(state.get("sampler", {}))
        self.public_warmed = bool(state.get("public_warmed", True))
        if "server_ledger" in state:
            self.server_ledger = PrivacyLedger.from_state_dict(state["server_ledger"])
        else:  # a checkpoint from before the server's ledger: those rounds without amplification
            z = self.cfg.fedavg_noise_multiplier
            self.server_ledger = PrivacyLedger([PrivacyEvent(z, count=self.rounds_done)] if self.rounds_done else [])
