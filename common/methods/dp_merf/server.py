"""DP-MERF's server side, wire-free.

The first step asks every available client for its one noisy summary; the mean of the accepted
ones becomes the target, and from then on each step is one generator step on the server that asks
no client anything (post-processing). The first step asks in rounds of ``COLLECT_CHUNK`` clients
(fewer for large summaries: ``COLLECT_BYTES``) and keeps a running sum, so the server holds one
round's replies at a time, never all K (16 kB per summary at the default 200 features: 1.6 GB at K =
10^5, twice that while they were stacked); a checkpoint taken between rounds keeps the sum and who
was asked, so a resumed run asks the rest. A step whose requests found no accepted summary asks
again those still available; the loop stops when none is left. Through secure sums the replies are
small acknowledgements and every cohort is asked at once.

Privacy records (``ServerBase``): the server's record of each client is charged with the planned
release when a reply is lost or malformed (the client may have released anyway), with the smaller
of what was planned and what the client ran when it answered, and not at all on a refusal; the
clients' own ledgers are fetched at the end and reports keep the larger.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.statement import KIND_PER_CLIENT
from common.secagg import split_cohorts

from ..base import NOT_APPLICABLE, ServerBase
from ..protocol import Reply, StepOutcome, SumResult
from .generator import MerfGenerator
from .messages import MerfRelease, MerfRequest
from .privacy import RULE_DP_MERF, honest_norm_bound, release_spec, statement

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

    from .features import FeatureFamily

COLLECT_CHUNK = 1024  # clients asked per round of the collection, at most
COLLECT_BYTES = 256 * 2**20  # and at most this many bytes of float32 summaries in one round's replies


def collect_chunk(shape: tuple[int, int]) -> int:
    """Clients asked per round: ``COLLECT_CHUNK``, fewer when their summaries are large (DP-NTK's 6.3 MB
    each would hold 6.4 GB per round of 1,024, and the transport's copies several times that)."""
    return max(1, min(COLLECT_CHUNK, COLLECT_BYTES // (4 * shape[0] * shape[1])))


class DpMerfServer(ServerBase):
    reply_noun = "release"
    epsilon_kind = KIND_PER_CLIENT
    accounting = RULE_DP_MERF

    def __init__(self, cfg: ExperimentConfig, num_classes: int, family: FeatureFamily, name: str) -> None:
        super().__init__(cfg)
        self.family, self.name = family, name
        self.generator = MerfGenerator(cfg, num_classes, family)
        self.steps_done = 0
        self.cohort_rng = np.random.default_rng(cfg.seed)  # who shares a cohort: public, no privacy role
        self._pending: deque[int] = deque()  # nodes of this collection pass not asked yet
        self._asked: set[int] = set()  # clients asked in this pass
        self._sum: torch.Tensor | None = None  # float64 sum of the summaries accepted in this pass
        self._count = 0
        self.use_channel(release_spec(cfg, family))  # ``planned``: what one release is charged

    @property
    def collected(self) -> bool:
        return self.generator.target is not None

    # --- a step ----------------------------------------------------------------------------------
    def select_nodes(self, available: list[int]) -> list[int]:
        """Every available node until the summaries are in, ``COLLECT_CHUNK`` per round (all at once
        through secure sums); nobody afterwards."""
        if self.collected:
            return []
        if self.summing:
            return list(available)
        if not self._pending:  # a new pass (or a resumed one): those available not asked in it yet
            self._pending = deque(n for n in available if self.client_of(n) not in self._asked)
        chunk = collect_chunk(self.generator.shape)
        return [self._pending.popleft() for _ in range(min(chunk, len(self._pending)))]

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, MerfRequest]]:
        if nodes and self.cfg.progress and not self._asked:  # the one long step: say what it waits for
            total = len(nodes) + len(self._pending)
            how = (
                f" through the {self.channel.name} channel"
                if self.summing
                else (f", {len(nodes):,} at a time" if self._pending else "")
            )
            tqdm.write(f"step {step}: asking {total:,} clients for their one noisy summary each{how}")
        if self.summing:  # one session per cohort of c to 2c - 1
            out = []
            for cohort in split_cohorts(nodes, self.cfg.secagg_cohort, self.cohort_rng):
                session = self.summing.open(step, cohort, tag="merf")
                out += [(node, MerfRequest(step=step, session=session)) for node in cohort]
            return out
        return [(node, MerfRequest(step=step)) for node in nodes]

    def expectations(self, step: int) -> dict[str, Any]:
        return {"step": step, "shape": self.generator.shape, "secure": self.summing is not None}

    def on_lost(self, reply: Reply) -> None:
        self.charge(reply.node, self.planned)  # it may have released anyway

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> torch.Tensor | None:
        """Charge the release (the smaller noise multiplier of what was planned and what the client
        says it ran); its summary, unless no honest client sends it."""
        release: MerfRelease = reply.payload
        nm = min(self.planned.noise_multiplier, release.noise_multiplier)
        self.charge(reply.node, PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, void=self.planned.void))
        summary = torch.from_numpy(release.embedding)
        bound = honest_norm_bound(self.cfg, summary.numel(), self.noise_scale)
        if not float(summary.norm()) <= bound:  # charged (it was released), but not used
            why = (
                f"its norm {float(summary.norm()):.3g} exceeds {bound:.3g}, what a summary clipped to S plus "
                "the noise allows"
            )
            self.reject(reply, outcome, why)
            return None
        return summary

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        if not self.collected:
            if self.summing:
                if not accepted:
                    outcome.notes.append(self._none_accepted(step))
                return  # the summaries wait on the nodes: the secure sums follow (``absorb_sums``)
            if not self._collect(step, accepted, replies, outcome):
                return
        self._generator_step(step, outcome)

    def _collect(self, step: int, accepted: list[torch.Tensor], replies: list[Reply], outcome: StepOutcome) -> bool:
        """Add a round's summaries to the pass's sum; True once the pass is over and the mean of its
        accepted summaries is the target (a note, and a new pass next round, when none was)."""
        self._asked.update(r.client for r in replies)
        if accepted:
            part = torch.stack(accepted).double().sum(dim=0)
            self._sum = part if self._sum is None else self._sum + part
            self._count += len(accepted)
        if self._pending:  # more of this pass to ask: G waits for every summary
            outcome.more = True
            return False
        count, total = self._count, self._sum
        self._asked, self._sum, self._count = set(), None, 0
        if not count:
            outcome.notes.append(self._none_accepted(step))
            return False
        self.generator.set_mean((total / count).float(), count)
        return True

    @staticmethod
    def _none_accepted(step: int) -> str:
        return f"step {step}: no client's summary was accepted; asking those still available"

    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None:
        """The mean of every revealed cohort sum becomes the target; then the step's generator step."""
        total, count = self.summing.total(results, outcome)
        if total is None:
            outcome.notes.append(f"step {step}: no secure sum was revealed; asking those still available")
            return
        self.generator.set_mean(torch.from_numpy(total / count).float().reshape(self.generator.shape), count)
        self._generator_step(step, outcome)

    def _generator_step(self, step: int, outcome: StepOutcome) -> None:
        loss = self.generator.step()
        if not torch.isfinite(torch.tensor(loss)):
            outcome.notes.append(f"step {step}: the generator's loss was not finite")
        self.steps_done += 1
        outcome.took_step = True
        outcome.metrics = {"train/g_loss": loss, "train/releases": float(self.generator.releases)}

    def released_generator(self) -> nn.Module:
        return self.generator.ema.module

    # --- the report ------------------------------------------------------------------------------
    def beside(self, *, final: bool) -> dict[str, Any]:
        return {
            **NOT_APPLICABLE,
            "assumption": "not applicable: every client releases once and nobody is sampled, so there is "
            "no amplification to claim; the per-client ε holds against any server",
        }

    def mechanism(self) -> dict[str, float]:
        cfg = self.cfg
        return {
            **({"c": self.spec.cohort} if self.summing else {}),
            "σ": cfg.merf_noise_multiplier,
            "S": cfg.merf_clip,
            "d": self.generator.fmap.dim,
            "releases used": self.generator.releases,
        }

    def parameters(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "noise_multiplier": cfg.merf_noise_multiplier,
            "clip": cfg.merf_clip,
            **self.family.parameters(cfg),
            "releases_used": self.generator.releases,
        }

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        return statement(self.cfg, self.family, self.name, ledgers, releases_used=self.generator.releases)

    # --- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            **({"secure_sums": self.summing.state_dict()} if self.summing else {}),
            "generator": self.generator.state_dict(),
            "records": self.records.state_dict(),
            "steps_done": self.steps_done,
            # A collection stopped between rounds: its sum so far and whom it asked (client ids)
            "collection": {"sum": self._sum, "count": self._count, "asked": sorted(self._asked)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.records.load_state_dict(state["records"])
        self.steps_done = int(state["steps_done"])
        collection = state.get("collection", {})  # absent: a checkpoint from before rounds existed
        self._sum, self._count = collection.get("sum"), int(collection.get("count", 0))
        if self._sum is not None and tuple(self._sum.shape) != self.generator.shape:
            raise ValueError(
                f"the checkpoint's collection has shape {tuple(self._sum.shape)}, this run's is {self.generator.shape}"
            )
        self._asked, self._pending = {int(c) for c in collection.get("asked", [])}, deque()
        if self.summing and "secure_sums" in state:
            self.summing.load_state_dict(state["secure_sums"])
