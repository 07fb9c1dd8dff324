"""DPGAN's messages: ``train.dpgan`` carries a ``DpganRound`` and its ``DpganReply``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.io.codec import PayloadError
from common.messages import StateDict, Stats

MSG_ROUND = "train.dpgan"


@dataclass
class DpganRound:
    """Server -> curator: run round ``step``."""

    step: int


@dataclass
class DpganReply:
    """The curator's round: G's weights, the statistics of D on fakes, and its whole ledger; or a refusal."""

    step: int
    refused: bool = False
    reason: str = ""
    noise_multiplier: float = 0.0  # the curator's σ and q (a refusal says 0)
    sample_rate: float = 0.0
    n_d: int | None = None
    discriminator_steps: int | None = None
    ledger: str | None = None
    stats: Stats = field(default_factory=dict)
    generator: StateDict | None = None

    def decoded(self, *, step: int, like: StateDict | None = None) -> DpganReply:
        """The reply checked against the round it answers and, given ``like`` (the server's G),
        its generator against G (``generator_mismatch``)."""
        if self.step != step:
            raise PayloadError(f"the reply is for round {self.step}, expected round {step}")
        if not self.refused and (self.generator is None or self.ledger is None or self.n_d is None):
            raise PayloadError("a round's reply lacks the generator, the ledger or n_D")
        problem = generator_mismatch(self.generator, like) if like is not None and not self.refused else ""
        if problem:
            raise PayloadError(f"the reply's generator cannot be G: {problem}")
        return self


def generator_mismatch(state: StateDict, like: StateDict) -> str:
    """Why ``state`` cannot replace the server's G (""): other entries, another shape or dtype
    (loading it would crash the run), or a NaN or infinite value (the EMA, the released model, would
    take it). G is post-processing of the DP discriminator, so saying why releases nothing more."""
    if state.keys() != like.keys():
        missing, extra = sorted(set(like) - set(state)), sorted(set(state) - set(like))
        return f"its entries differ from G's (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, t in state.items():
        ref = like[name]
        if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
            return f"{name} is {t.dtype} of shape {tuple(t.shape)}, expected {ref.dtype} of shape {tuple(ref.shape)}"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"{name} contains NaN or infinite values"
    return ""


MESSAGES = {MSG_ROUND: (DpganRound, DpganReply)}
