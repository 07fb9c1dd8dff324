"""A toy method, from a test folder: the smallest thing the contract (``common/methods/protocol.py``)
admits, to show that a method is one folder plus one registry line and nothing else.

Each step every available client releases the mean intensity of its images plus Gaussian noise
(sensitivity 1 under replacing its whole data: the mean lies in [0, 1]), charged to its own ledger
and its node's; the server averages what it receives. Its generator never learns anything: the
point is everything around it (options, messages, refusals, ledgers, reports), not the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from common.learning.models import GeneratorEMA, build_generator
from common.methods.base import MethodBase, ServerBase
from common.methods.protocol import ClientNode, PriorReleases, Reply, StepOutcome, refusal
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.sanitizer import release_noise_source
from common.privacy.statement import KIND_PER_CLIENT, assemble, per_client_sentence

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

NOISE = 2.0  # the noise multiplier of every release (no option: the toy's section is empty)
RULE = "per-client, untrusted server: each release is one Gaussian mechanism with noise multiplier 2"


@dataclass(frozen=True)
class Options:
    """The toy's section of the configuration: nothing beyond the run's own options."""


@dataclass
class ToyRequest:
    step: int


@dataclass
class ToyReply:
    step: int
    value: float = 0.0
    noise_multiplier: float = 0.0
    refused: bool = False
    reason: str = ""

    def decoded(self, *, step: int) -> ToyReply:
        from common.io.codec import PayloadError

        if self.step != step:
            raise PayloadError(f"the reply is for step {self.step}, expected step {step}")
        return self


class ToyServer(ServerBase):
    epsilon_kind = KIND_PER_CLIENT
    accounting = RULE

    def __init__(self, cfg: ExperimentConfig, num_classes: int) -> None:
        super().__init__(cfg)
        torch.manual_seed(cfg.seed)
        self.generator = build_generator(cfg.model, z_dim=cfg.z_dim, num_classes=num_classes)
        self.ema = GeneratorEMA(self.generator, decay=cfg.ema_decay)
        self.planned = PrivacyEvent(noise_multiplier=NOISE)
        self.steps_done = 0

    def select_nodes(self, available: list[int]) -> list[int]:
        return list(available)

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, ToyRequest]]:
        return [(node, ToyRequest(step=step)) for node in nodes]

    def expectations(self, step: int) -> dict[str, Any]:
        return {"step": step}

    def on_lost(self, reply: Reply) -> None:
        self.charge(reply.node, self.planned)

    def accept(self, step: int, reply: Reply, outcome: StepOutcome) -> float:
        self.charge(reply.node, PrivacyEvent(noise_multiplier=min(NOISE, reply.payload.noise_multiplier)))
        return reply.payload.value

    def update(self, step: int, accepted: list[Any], replies: list[Reply], outcome: StepOutcome) -> None:
        if accepted:
            self.steps_done += 1
            outcome.took_step = True
            outcome.metrics = {"train/mean": sum(accepted) / len(accepted)}

    def released_generator(self) -> nn.Module:
        return self.ema.module

    def mechanism(self) -> dict[str, float]:
        return {"σ": NOISE}

    def parameters(self) -> dict[str, Any]:
        return {"noise_multiplier": NOISE}

    def statement(self, ledgers: dict[int, PrivacyLedger]) -> str:
        cfg = self.cfg
        sentence, worst = per_client_sentence(ledgers, delta=cfg.delta, accountant=cfg.accountant, what="means")
        return assemble(list(ledgers.values()), ["Toy.", sentence, f"Rule: {RULE}."], worst)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.state_dict(), "records": self.records.state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema.load_state_dict(state["ema"])
        self.records.load_state_dict(state["records"])
        self.steps_done = int(state["steps_done"])


class Toy(MethodBase):
    name = "toy"
    options = Options
    messages = {"train.toy": (ToyRequest, ToyReply)}
    step_label = "steps"

    def validate(self, cfg: ExperimentConfig) -> None:
        return None

    def release_noise(self, cfg: ExperimentConfig) -> float:
        return NOISE

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return []

    def calibrate(self, cfg: ExperimentConfig, *, pooled_size: int | None, prior=()) -> ExperimentConfig:
        return cfg

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> ToyServer:
        return ToyServer(cfg, num_classes)

    def answer(self, node: ClientNode, request: ToyRequest) -> ToyReply:
        cfg, state = node.cfg, node.load_state()
        before, event = state.ledger.copy(), PrivacyEvent(noise_multiplier=NOISE)
        over = node.policy.release_refusal(state.ledger, event, cfg, "one more mean")
        if over:
            return refusal(ToyReply, request.step, state.client_id, over)
        noise, void = release_noise_source(cfg.noise_seed, state.client_id, request.step)
        value = float(state.data.images.mean()) + NOISE * float(torch.randn(1, generator=noise))
        ran = PrivacyEvent(noise_multiplier=NOISE, void=void)
        state.ledger.record(ran)
        state.version += 1
        node.record_release(state, before)
        return ToyReply(step=request.step, value=value, noise_multiplier=ran.noise_multiplier)


METHOD = Toy()
