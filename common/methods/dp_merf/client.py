"""A DP-MERF client's one release: its summary clipped to S and noised with std 2σS per coordinate,
recorded once in its ledger; a node's budget refuses any second release."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from common.channels import channel_for
from common.data import num_classes_for
from common.device import resolve_device
from common.privacy import NodePolicy, PrivacyEvent
from common.privacy.sanitizer import release_noise_source

from ..protocol import ClientNode, refusal
from .features import FeatureFamily, embed
from .messages import MerfRelease, MerfRequest
from .privacy import release_spec

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig


def clip_summary(summary: Tensor, bound: float) -> Tensor:
    """``summary`` scaled to L2 norm at most ``bound`` (unchanged when already within it)."""
    return summary * min(1.0, bound / (float(summary.norm()) + 1e-12))


def release(
    state: ClientState,
    cfg: ExperimentConfig,
    request: MerfRequest,
    policy: NodePolicy,
    *,
    family: FeatureFamily,
    summary: Tensor | None = None,
) -> MerfRelease:
    """This client's one release, or a refusal when its budget would be exceeded (a second request
    is refused the same way: the budget is the target ε of a single release). ``summary``: a given
    summary instead of the client's own (a privacy audit's canary, ``fedgan audit``); it is clipped,
    noised and charged like any other. The run's channel noises it (``ReleaseChannel.noised``: the
    local one with std 2σS per coordinate) and says what it costs."""
    channel, spec = channel_for(cfg), release_spec(cfg, family)
    event = channel.events(cfg, spec)[0]
    over = policy.release_refusal(state.ledger, event, cfg, "one more release")
    if over:
        return refusal(MerfRelease, request.step, state.client_id, over)
    if summary is None:
        device = resolve_device(cfg.device)
        images, labels = state.data.images.to(device), state.data.labels.to(device)
        summary = embed(family.build(cfg, device), images, labels, num_classes_for(cfg))
    noise, void = release_noise_source(cfg.noise_seed, state.client_id, request.step)
    noisy = channel.noised(cfg, spec, clip_summary(summary.cpu(), cfg.merf_clip), noise)
    ran = PrivacyEvent(noise_multiplier=event.noise_multiplier, sample_rate=1.0, void=void or event.void)
    state.ledger.record(ran)
    state.version += 1
    return MerfRelease(
        step=request.step, embedding=noisy.numpy().astype(np.float32), noise_multiplier=ran.noise_multiplier
    )


def deposit_release(node: ClientNode, state: ClientState, request: MerfRequest, family: FeatureFamily) -> MerfRelease:
    """This client's one release through a summing channel: admitted by the node's policy, then its
    summary handed to the channel, which encodes it with the client's noise share, charges it and
    deposits it on the node for ``request.session`` (only the cohort's sum is ever revealed)."""
    cfg = node.cfg
    channel, spec = channel_for(cfg), release_spec(cfg, family)
    admission = channel.admit(node, state, spec)
    if admission.refused:
        return refusal(MerfRelease, request.step, state.client_id, admission.refused)
    device = resolve_device(cfg.device)
    images, labels = state.data.images.to(device), state.data.labels.to(device)
    summary = embed(family.build(cfg, device), images, labels, num_classes_for(cfg)).cpu().numpy()
    ran = channel.deposit(node, state, request.session, request.step, spec, summary, admission)
    return MerfRelease(step=request.step, deposited=True, noise_multiplier=ran.noise_multiplier)


def released_before(made: int, policy: NodePolicy) -> str:
    """Why a node that made ``made`` one-shot releases (DP-MERF's or another one-shot method's, in any
    run) makes no other (""): a one-shot method is one release per client, so another needs a budget
    in the node's own policy (max-epsilon), which then decides. Without one, a server could ask again
    in every run and the releases would compose without bound."""
    if made and not policy.max_epsilon:
        return (
            f"this node already released its DP-MERF summary or another one-shot method's ({made} release(s) in "
            "its ledger); another needs a "
            "budget in its own policy (max-epsilon)"
        )
    return ""
