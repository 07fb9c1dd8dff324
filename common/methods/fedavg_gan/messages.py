"""Fed-Avg GAN's messages: ``train.fedavg`` carries a ``FedAvgRound`` and its ``FedAvgReply``."""

from __future__ import annotations

from dataclasses import dataclass

from common.io.codec import PayloadError
from common.messages import StateDict

from .dp_fedavg import delta_mismatch

MSG_ROUND = "train.fedavg"


@dataclass
class FedAvgRound:
    """Server -> sampled client: G and D, the round and a seed for the client's public randomness."""

    step: int
    seed: int
    generator: StateDict
    discriminator: StateDict
    session: str = ""  # secure aggregation: deposit the delta for this secure sum instead of sending it


@dataclass
class FedAvgReply:
    """Client -> server: the raw delta of D's floating-point state after the local steps, or a
    refusal (``refused`` and ``reason`` travel only then: a delta's reply carries nothing more)."""

    step: int
    delta: StateDict | None = None
    refused: bool | None = None
    reason: str | None = None
    deposited: bool | None = None  # secure aggregation: the delta waits on the node for the secure sum

    def decoded(
        self, *, step: int, shapes: dict[str, tuple[int, ...]] | None = None, secure: bool = False
    ) -> FedAvgReply:
        """The reply checked against the round it answers and, given ``shapes`` (D's floating-point
        entries), against D: a delta that does not fit is this sender's malformed reply."""
        if self.step != step:
            raise PayloadError(f"the delta is for round {self.step}, expected round {step}")
        if self.refused:
            return self
        if secure:
            if not self.deposited or self.delta is not None:
                raise PayloadError("a secure-aggregation reply is a deposit on the node, never a delta sent")
            return self
        if self.delta is None:
            raise PayloadError("the reply carries no delta")
        problem = delta_mismatch(self.delta, shapes) if shapes is not None else ""
        if problem:
            raise PayloadError(f"the delta does not fit the discriminator: {problem}")
        return self


MESSAGES = {MSG_ROUND: (FedAvgRound, FedAvgReply)}
