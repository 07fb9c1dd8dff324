"""GS-WGAN through a summing channel (``--secure-aggregation``): the m clients of a step answer the
same fake batch, and the server sees only the sum of their answers.

Each answer is the B per-sample gradients of the queried batch, each row clipped to C (so the whole
answer's norm is at most C√B, its per-client sensitivity 2C√B as before); the channel encodes it
with the client's noise share and deposits it (``common/channels/secure_sum.py``). The sum carries
the noise multiplier σ/√B of one answer: against a server that runs the protocol a client's ε per
answer is what it was alone, but the m answers now share that noise instead of each adding its own,
so the step's gradient carries √t times less noise per client (t ≈ 2m/3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.channels import channel_for
from common.privacy.dct import to_coefficients
from common.privacy.sanitizer import clip_sample_grads

from ..protocol import ClientNode, refusal
from .client import begin_answer, critic_phase
from .messages import GsAnswer, GsQuery
from .privacy import release_spec

if TYPE_CHECKING:
    from common.client_state import ClientState


def deposit_answer(node: ClientNode, state: ClientState, query: GsQuery) -> GsAnswer:
    """One query answered through the step's sum: the node's policy checked on the event it counts,
    the critic phase, then the per-sample gradients clipped and handed to the channel, which encodes,
    charges and deposits them for ``query.session``."""
    cfg = node.cfg
    channel, spec = channel_for(cfg), release_spec(cfg)
    admission = channel.admit(node, state, spec)
    if admission.refused:
        return refusal(GsAnswer, query.step, state.client_id, admission.refused)
    pending = begin_answer(state, cfg, query, node.policy)
    if isinstance(pending, GsAnswer):  # a refusal
        return pending
    grads, _ = critic_phase(pending, cfg)
    released = to_coefficients(grads, cfg.grad_dct) if cfg.grad_dct else grads
    finite = torch.nan_to_num(released.detach().cpu().double(), nan=0.0, posinf=0.0, neginf=0.0)
    rows = clip_sample_grads(finite, clip=cfg.clip).numpy()
    ran = channel.deposit(node, state, query.session, query.step, spec, rows, admission)
    return GsAnswer(step=query.step, deposited=True, noise_multiplier=ran.noise_multiplier)
