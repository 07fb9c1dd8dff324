"""GS-WGAN through secure sums (``--secure-aggregation``): the m clients of a step answer the same
fake batch, and the server sees only the sum of their answers.

Each answer is the B per-sample gradients of the queried batch, each row clipped to C (so the whole
answer's norm is at most C√B, its per-client sensitivity 2C√B as before), scaled to integers of
granularity γ = C√B/2^14, conditionally rounded and given a Skellam share Sk(μ/t)
(``common/secagg/plan.py``); the node deposits it and only the SecAgg+ sum over the
step's m clients is revealed, never of fewer than t. The sum carries Sk(μ) with μ set so that its
noise multiplier is σ/√B, the one answer's: against a server that runs the protocol a client's
ε per answer is what it was alone, but the m answers now share that noise instead of each adding
its own, so the step's gradient carries √t times less noise per client (t ≈ 2m/3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.privacy.dct import to_coefficients
from common.privacy.sanitizer import clip_sample_grads
from common.secagg.plan import client_vector, release_events

from ..protocol import ClientNode, refusal
from ..secure_sums import deposit
from .client import begin_answer, critic_phase
from .messages import GsAnswer, GsQuery
from .privacy import client_void
from .secure_plan import coords, fewest_survivors, plan

__all__ = ["coords", "fewest_survivors", "plan", "secure_answer"]

if TYPE_CHECKING:
    from common.client_state import ClientState


def secure_answer(node: ClientNode, state: ClientState, query: GsQuery) -> GsAnswer:
    """One query answered through the step's secure sum: the node's policy checked on the event it
    counts, the critic phase, then the per-sample gradients clipped, encoded with this client's
    share and deposited for ``query.session``; charged before the deposit."""
    cfg, policy = node.cfg, node.policy
    p = plan(cfg)
    protocol, own = release_events(p, client_void(cfg))
    over, counted = policy.secure_release_refusal(state.ledger, protocol, own, cfg, "one more answer")
    if over:
        return refusal(GsAnswer, query.step, state.client_id, over)
    pending = begin_answer(state, cfg, query, policy)
    if isinstance(pending, GsAnswer):  # a refusal
        return pending
    grads, _ = critic_phase(pending, cfg)
    released = to_coefficients(grads, cfg.grad_dct) if cfg.grad_dct else grads
    finite = torch.nan_to_num(released.detach().cpu().double(), nan=0.0, posinf=0.0, neginf=0.0)
    rows = clip_sample_grads(finite, clip=cfg.clip).numpy()
    vector = client_vector(rows, p, cfg.noise_seed, state.client_id, query.step)
    deposit(node, state, query.session, vector, p, (protocol, own, counted))
    return GsAnswer(step=query.step, deposited=True, noise_multiplier=protocol.noise_multiplier)
