"""GS-WGAN's canary for ``fedgan audit``: a client whose per-sample gradients are crafted, answered
by ``finish_answer`` (sanitized, charged and encoded for the wire as any answer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.io.codec import decode_grads
from common.privacy import NodePolicy
from common.privacy.dct import to_pixels

from .client import PendingAnswer, finish_answer
from .privacy import planned_event

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig


def direction(cfg: ExperimentConfig) -> torch.Tensor:
    """A unit direction u of the released space, in pixels: one pixel, or (with ``grad_dct``) the first
    DCT coefficient (the basis is orthonormal)."""
    if cfg.grad_dct:
        coefficient = torch.zeros(1, cfg.grad_dct**2)
        coefficient[0, 0] = 1.0
        return to_pixels(coefficient, cfg.grad_dct)
    unit = torch.zeros(1, 1, 28, 28)
    unit[0, 0, 0, 0] = 1.0
    return unit


def canary_score(
    state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
) -> float:
    """Up to ``releases`` answers until the budget refuses, each B per-sample gradients
    ``sign·magnitude·C·u``; the attacker's score sums the decoded u-coordinate of every row."""
    B = cfg.batch_size
    grads = direction(cfg).repeat(B, 1, 1, 1) * sign * magnitude * cfg.clip
    nothing = torch.zeros(0)
    score = 0.0
    for step in range(releases):
        if policy.release_refusal(state.ledger, planned_event(cfg, B), cfg, "one more answer"):
            break
        answer = finish_answer(
            PendingAnswer(state, step, nothing, nothing, nothing, nothing, B), cfg, grads.clone(), {}
        )
        released = decode_grads(answer.grad, answer.grad_encoding, batch_size=B, coords=cfg.grad_dct**2)
        score += float(released.reshape(B, -1)[:, 0].sum())
    return score
