"""GS-WGAN's server side, wire-free: whom to query, what to send, and what the answers do.

Per generator step: draw m of the K_t clients still available, uniformly without replacement and in
secret (``Sampler``), send each (n_critic+1)*B generated samples with server-drawn labels (only the
B queried ones when clients reuse fakes for their critic steps, ``critic_fakes``), receive B
sanitized per-sample gradients from each, divide by B*m, and let ``ServerGenerator`` backpropagate
them (straight-through at G's unquantized output), step Adam and update the EMA.

Privacy records, all ledgers (``common/privacy``):
- ``server_ledger``: one without-replacement event per step at the rate that actually ran,
  q_t = m/K_t, recorded when the sample is drawn: the amplified (trusted-sampling) figure;
- ``records`` (``ServerBase``): the server's record of each client, charged with what a query
  planned when its reply is lost or malformed (the client may have answered, and charged itself,
  anyway), with the smaller of what was planned and what the client ran when it answered, and not
  at all on an explicit refusal, which releases nothing; reports keep the larger of it and the
  client's own ledger.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from common.io.codec import encode_labels, encode_samples
from common.privacy import PrivacyEvent, PrivacyLedger, Sampler
from common.privacy.statement import KIND_AMPLIFIED, KIND_PER_CLIENT, server_entry

from ..base import ServerBase
from ..protocol import PriorReleases, Reply, StepOutcome, SumResult
from .generator import ServerGenerator
from .messages import GsAnswer, GsQuery
from .privacy import RULE_AMPLIFIED_WOR, RULE_PER_CLIENT, implausible_norms, release_spec, statement

if TYPE_CHECKING:
    import numpy as np

    from common.methods import ExperimentConfig

CLIENT_STAT_KEYS = 16  # what --client-stats sends: the critic's statistics and two gradient figures


class GsWganServer(ServerBase):
    reply_noun = "answer"
    progress_metrics = {"w": "train/wasserstein"}  # only with --client-stats: clients keep it private otherwise
    epsilon_kind = KIND_PER_CLIENT
    accounting = RULE_PER_CLIENT

    def __init__(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None = None) -> None:
        super().__init__(cfg, prior)
        self.generator = ServerGenerator(cfg, num_classes)
        start = self.prior.start
        if start is not None:  # a seeded run (``common/methods/seeding``): G and the clients' D start from it
            self.generator.start_from(start)
        self.critic_sent: set[int] = set()  # clients sent the seed's critic (each once)
        self.sampler = Sampler(None if cfg.sampling_seed < 0 else cfg.sampling_seed)
        self.server_ledger = PrivacyLedger(self.prior.server)
        self.steps_done = 0
        self._attached: dict[int, torch.Tensor] = {}
        self._selected = 0
        self.use_channel(release_spec(cfg))  # ``planned``: what one answer is charged

    # --- a step ----------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """m of the available nodes, uniformly without replacement, from the secret sampler; the
        server's ledger records the draw at the rate that actually ran (q_t = m/K_t). Through secure
        sums (no amplification claimed), m within budget, least-used first (``sample_within_budget``)."""
        if self.summing:  # a refusal would shrink the step's sum below its floor, wasting the others' answers
            chosen = self.sample_within_budget(self.sampler, available, self.cfg.clients_per_step, self.planned)
            return chosen if len(chosen) >= self.summing.fewest_to_ask else []  # else the run ends here
        chosen = self.sampler.choose(available, self.cfg.clients_per_step)
        self.server_ledger.record(
            PrivacyEvent(
                noise_multiplier=self.planned.noise_multiplier,
                sample_rate=len(chosen) / len(available),
                sampling="wor",
                population=len(available),
                void=self.sampler.void_reason or self.planned.void,
            )
        )
        return chosen

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, GsQuery]]:
        if not self.generator.public_warmed:
            self.generator.public_warm_start()
        self._attached = {}
        self._selected = len(nodes)
        if self.summing and nodes:  # one fake batch for the step's m clients, one secure sum of their answers
            fakes, labels, attached = self.generator.query_batches(self.cfg.batch_size, self._critic_batches())
            self._attached = {-1: attached}
            query = dataclasses.replace(self._query(step, fakes, labels), session=self.summing.open(step, nodes, "gs"))
            return [(node, self._with_critic(node, query)) for node in nodes]
        out = []
        for node in nodes:
            fakes, labels, attached = self.generator.query_batches(self.cfg.batch_size, self._critic_batches())
            self._attached[node] = attached
            out.append((node, self._with_critic(node, self._query(step, fakes, labels))))
        return out

    def _with_critic(self, node: int, query: GsQuery) -> GsQuery:
        """A seeded run sends each client the server's critic (public: derived from the seed release)
        once, with its first query: its D starts from it instead of from scratch."""
        client = self.client_of(node)
        critic = self.prior.start.critic if self.prior.start is not None else None
        if critic is None or client in self.critic_sent:
            return query
        self.critic_sent.add(client)
        return dataclasses.replace(query, critic=critic)

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

    def expectations(self, step: int) -> dict[str, Any]:
        return {
            "batch_size": self.cfg.batch_size,
            "step": step,
            "coords": self.cfg.grad_dct**2,
            "secure": self.summing is not None,
        }

    def on_lost(self, reply: Reply) -> None:
        self.charge(reply.node, self.planned)  # it may have answered, and charged itself, anyway

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> tuple[torch.Tensor, Any] | None:
        """Charge the answer (the smaller noise multiplier of what was asked and what the client says
        it ran); its gradients and the batch they belong to, unless no honest client sends them."""
        answer: GsAnswer = reply.payload
        nm = min(self.planned.noise_multiplier, answer.noise_multiplier)
        self.charge(reply.node, PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=self.planned.void))
        grad: np.ndarray = answer.grad
        implausible = implausible_norms(grad, self.cfg, self.noise_scale)
        if implausible:  # charged (it was released), but not applied
            self.reject(reply, outcome, implausible)
            return None
        stats = requested_stats(answer.stats, self.cfg.client_stats)
        return self._attached[reply.node], torch.from_numpy(grad), stats

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        if self.summing:
            return  # the answers wait on the nodes: the step's secure sum follows (``absorb_sums``)
        self._attached = {}
        if not accepted:
            return
        attached, grads, stats = (list(column) for column in zip(*accepted, strict=True))
        # Divide by B and by the number of sampled clients m (the mean over every sampled answer).
        if self.generator.apply(attached, grads, divisor=self.cfg.batch_size * len(replies)):
            self.steps_done += 1
            outcome.took_step = True
            outcome.metrics = _mean_stats(stats)
        else:
            outcome.notes.append(f"step {step}: the generator's gradient was not finite; step skipped")

    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None:
        """The revealed sum of the step's answers through G, divided by B·m (every sampled client); a
        step whose sums keep revealing nothing is given up after a few attempts (``gave_up``)."""
        attached, self._attached = self._attached.get(-1), {}
        total, _ = self.summing.total(results, outcome)
        if total is None or attached is None:
            if results:
                self.summing.gave_up(step, outcome)
            return
        B = self.cfg.batch_size
        grads = torch.from_numpy(total.reshape(B, -1) if self.cfg.grad_dct else total.reshape(B, 1, 28, 28)).float()
        if self.generator.apply([attached], [grads], divisor=B * self._selected):
            self.steps_done += 1
            outcome.took_step = True
        else:
            outcome.notes.append(f"step {step}: the generator's gradient was not finite; step skipped")

    def released_generator(self) -> nn.Module:
        return self.generator.ema.module

    # --- the report ------------------------------------------------------------------------------
    def beside(self, *, final: bool) -> dict[str, Any]:
        """The amplified ε from the server's own ledger of its sampling."""
        cfg = self.cfg
        return server_entry(
            self.server_ledger,
            delta=cfg.delta,
            accountant=cfg.accountant,
            kind=KIND_AMPLIFIED,
            rule=RULE_AMPLIFIED_WOR,
            final=final,
        )

    def mechanism(self) -> dict[str, float]:
        cfg = self.cfg
        return {"B": cfg.batch_size, "σ": cfg.noise_multiplier, "C": cfg.clip, "m per step": cfg.clients_per_step}

    def parameters(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "clients_per_step": cfg.clients_per_step,
            "noise_multiplier": cfg.noise_multiplier,
            "clip": cfg.clip,
            "wire_dtype": cfg.wire_dtype,
            "wire_samples": cfg.wire_samples,
            "wire_compression": cfg.wire_compression,
            "critic_fakes": cfg.critic_fakes,
            "client_stats": cfg.client_stats,
        }

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        return statement(self.cfg, ledgers, self.server_ledger)

    # --- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.state_dict(),
            "records": self.records.state_dict(),
            "server_ledger": self.server_ledger.state_dict(),
            "sampler": self.sampler.state_dict(),
            "steps_done": self.steps_done,
            "critic_sent": sorted(self.critic_sent),
            **({"secure_sums": self.summing.state_dict()} if self.summing else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.steps_done = int(state["steps_done"])
        self.critic_sent = {int(c) for c in state.get("critic_sent", [])}
        # "ledgers": checkpoints made before the records and the server's ledger existed
        self.records.load_state_dict(state.get("records", {"charged": state.get("ledgers", {})}))
        if "server_ledger" in state:
            self.server_ledger = PrivacyLedger.from_state_dict(state["server_ledger"])
        else:  # its sampling was not recorded: claim no amplification for those steps (conservative)
            self.server_ledger = PrivacyLedger([self.planned.times(self.steps_done)] if self.steps_done else [])
        self.sampler.load_state_dict(state.get("sampler", {}))
        if self.summing and "secure_sums" in state:
            self.summing.load_state_dict(state["secure_sums"])


def requested_stats(stats: dict[str, float], asked: bool) -> dict[str, float]:
    """The statistics the run asked for: none without --client-stats (a client sending them anyway is
    ignored), else at most CLIENT_STAT_KEYS short names."""
    if not asked:
        return {}
    return {k[:40]: v for k, v in sorted(stats.items())[:CLIENT_STAT_KEYS]}


def _mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*stats) if stats else set()
    return {f"train/{k}": sum(s.get(k, 0.0) for s in stats) / len(stats) for k in sorted(keys)}
