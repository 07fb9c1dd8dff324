"""DP-MERF's Flower strategy: a thin adapter over its core (``common/methods/dp_merf.py``).

The first step asks every available client for its one noisy summary; the mean of the accepted
ones becomes the target, and from then on each step is one generator step on the server that asks
no client anything (post-processing). A step whose request found no accepted summary asks again
those still available; the loop stops when none is left.

Privacy records: the server's record of each client (``records``) is charged with the planned
release when a reply is lost or malformed (the client may have released anyway), with the smaller of
what was planned and what the client ran when it answered, and not at all on a refusal; the clients'
own ledgers are fetched at the end and reports keep the larger (``records.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from common.codec import PayloadError
from common.config import ExperimentConfig
from common.messages import LEDGER, LedgerQuery
from common.methods.dp_merf import MSG_EMBED, MerfGenerator, MerfRelease, MerfRequest, honest_norm_bound, planned_event
from common.privacy import PrivacyEvent
from common.privacy.statement import (
    KIND_PER_CLIENT,
    RULE_DP_MERF,
    client_entry,
    dp_merf_statement,
    max_epsilon,
    not_private_reasons,
)
from protos import wire

from .base import Incoming, Outgoing, StepOutcome, Strategy
from .records import ClientRecords


class DpMerfStrategy(Strategy):
    def __init__(self, cfg: ExperimentConfig, num_classes: int, state_dir: str) -> None:
        self.cfg = cfg
        self.generator = MerfGenerator(cfg, num_classes)
        self.records = ClientRecords(cfg.delta)
        self.node_client: dict[int, int] = {}
        self.steps_done = 0
        self.planned = planned_event(cfg)

    @property
    def collected(self) -> bool:
        return self.generator.target is not None

    # --- hooks ---------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """Every available node until the summaries are in; nobody afterwards."""
        return [] if self.collected else list(available)

    def configure_step(self, step: int, nodes: list[int]) -> list[Outgoing]:
        if nodes and self.cfg.progress:  # the one long step: say what it waits for
            tqdm.write(f"step {step}: asking {len(nodes):,} clients for their one noisy summary each")
        return [Outgoing(node, MSG_EMBED, wire.encode(MerfRequest(step=step))) for node in nodes]

    def aggregate_step(self, step: int, replies: list[Incoming]) -> StepOutcome:
        outcome = StepOutcome(took_step=False)
        if not self.collected:
            accepted = [t for t in (self._accept(step, r, outcome) for r in replies) if t is not None]
            if not accepted:
                outcome.notes.append(f"step {step}: no client's summary was accepted; asking those still available")
                return outcome
            self.generator.set_target(accepted)
        loss = self.generator.step()
        if not torch.isfinite(torch.tensor(loss)):
            outcome.notes.append(f"step {step}: the generator's loss was not finite")
        self.steps_done += 1
        outcome.took_step = True
        outcome.metrics = {"train/g_loss": loss, "train/releases": float(self.generator.releases)}
        return outcome

    def released_generator(self) -> nn.Module:
        return self.generator.ema.module

    # --- replies -------------------------------------------------------------------------------
    def _charge(self, node: int, event: PrivacyEvent) -> None:
        self.records.charge(self.node_client.get(node, -1), event)

    def _accept(self, step: int, reply: Incoming, outcome: StepOutcome) -> torch.Tensor | None:
        """Validate one release and charge the server's record of its client; the summary or None."""
        if reply.content is None:
            self._charge(reply.node_id, self.planned)
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} failed: {reply.error}")
            return None
        try:
            release = wire.decode(MerfRelease, reply.content, step=step, shape=self.generator.shape)
        except PayloadError as err:
            self._charge(reply.node_id, self.planned)
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(f"node {reply.node_id} sent a malformed release, ignored: {err}")
            return None
        if release.refused:
            outcome.exhausted_nodes.append(reply.node_id)
            outcome.notes.append(release.reason)
            return None
        nm = min(self.planned.noise_multiplier, release.noise_multiplier)
        self._charge(reply.node_id, PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=self.planned.void))
        summary = torch.from_numpy(release.embedding)
        bound = honest_norm_bound(self.cfg, summary.numel())
        if not float(summary.norm()) <= bound:  # charged (it was released), but not used
            outcome.failed_nodes.append(reply.node_id)
            outcome.notes.append(
                f"node {reply.node_id} sent a release no honest client sends, ignored: its norm "
                f"{float(summary.norm()):.3g} exceeds {bound:.3g}, what a summary clipped to S plus the noise allows"
            )
            return None
        return summary

    # --- the clients' own ledgers --------------------------------------------------------------
    def ledger_queries(self, nodes: list[int]) -> list[Outgoing]:
        return [Outgoing(n, LEDGER, wire.encode(LedgerQuery())) for n in nodes]

    def absorb_ledgers(self, replies: list[Incoming], *, final: bool = True) -> list[str]:
        return self.records.absorb(self.node_client, replies, final=final)

    # --- privacy -------------------------------------------------------------------------------
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
            "accounting": RULE_DP_MERF,
            "epsilon_amplified": {
                "epsilon": None,
                "epsilon_reason": "not applicable",
                "kind": "",
                "assumption": "not applicable: every client releases once and nobody is sampled, so there is "
                "no amplification to claim; the per-client ε holds against any server",
            },
            "not_private": not_private_reasons(ledgers.values()),
            "mechanism": {
                "σ": cfg.merf_noise_multiplier,
                "S": cfg.merf_clip,
                "D": cfg.merf_features,
                "releases used": self.generator.releases,
            },
        }
        if final:
            report["statement"] = dp_merf_statement(
                ledgers,
                delta=cfg.delta,
                accountant=cfg.accountant,
                noise_multiplier=cfg.merf_noise_multiplier,
                clip=cfg.merf_clip,
                features=cfg.merf_features,
                dct=cfg.merf_dct,
                releases_used=self.generator.releases,
            )
        return report

    # --- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "records": self.records.state_dict(),
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.records.load_state_dict(state["records"])
        self.steps_done = int(state["steps_done"])
