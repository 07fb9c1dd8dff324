"""DP-MERF's messages: ``train.dpmerf`` carries a ``MerfRequest`` and its ``MerfRelease``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.io.codec import PayloadError

MSG_EMBED = "train.dpmerf"  # Flower routes by category ("train") and action


@dataclass
class MerfRequest:
    """Server -> client: release your summary (once; the node's budget refuses a second). With
    ``session`` (secure aggregation): deposit it, encoded with its noise share, for that secure sum
    instead of sending it."""

    step: int
    session: str = ""


@dataclass
class MerfRelease:
    """Client -> server: the noisy summary ``[num_classes, 2D+1]`` float32, or a refusal.

    ``noise_multiplier`` is the mechanism the client ran (its ledger entry); the server charges the
    smaller of it and what the run asks for."""

    step: int
    refused: bool = False
    reason: str = ""
    embedding: np.ndarray | None = None
    noise_multiplier: float = 0.0
    deposited: bool = False  # secure aggregation: the summary waits on the node for the secure sum

    def decoded(self, *, step: int, shape: tuple[int, int], secure: bool = False) -> MerfRelease:
        """The release validated against the request it answers: its step, its shape, finite values
        (``secure``: a deposit, and no summary in the clear)."""
        if self.step != step:
            raise PayloadError(f"the release is for step {self.step}, expected step {step}")
        if self.refused:
            return self
        if secure:
            if not self.deposited or self.embedding is not None:
                raise PayloadError("a secure-aggregation release is a deposit on the node, never a summary sent")
            if not self.noise_multiplier >= 0:
                raise PayloadError(f"invalid privacy event: noise_multiplier={self.noise_multiplier}")
            return self
        if self.embedding is None:
            raise PayloadError("the release carries no 'embedding' array")
        if tuple(self.embedding.shape) != tuple(shape):
            raise PayloadError(f"embedding has shape {tuple(self.embedding.shape)}, expected {tuple(shape)}")
        # The declared dtype, nothing else: an integer or bool array of the right shape would reach the
        # server's norm check and crash the run there (torch has no norm of an integer tensor).
        if self.embedding.dtype != np.float32:
            raise PayloadError(f"embedding has dtype {self.embedding.dtype}, expected float32")
        if not np.all(np.isfinite(self.embedding)):
            raise PayloadError("embedding contains NaN or infinite values")
        if not self.noise_multiplier >= 0:
            raise PayloadError(f"invalid privacy event: noise_multiplier={self.noise_multiplier}")
        return self
