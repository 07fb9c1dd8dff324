"""Fed-Avg GAN as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.channels import SUMS, ReleaseSpec, channel_for
from common.data import num_classes_for
from common.device import resolve_device

from ..base import MethodBase
from ..protocol import ClientNode, PriorReleases, refusal
from . import options, privacy, release
from .client import client_update
from .messages import MESSAGES, FedAvgReply, FedAvgRound
from .privacy import RAW_DELTA
from .server import FedAvgServer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import PrivacyEvent


class FedAvgGan(MethodBase):
    name = options.NAME
    options = options.Options
    messages = MESSAGES
    step_label = "rounds"
    unbounded_against_server = True  # clients send raw deltas: a node with a finite max-epsilon refuses
    channel_needs = frozenset({SUMS})  # a round's deltas can be summed, each client adding a noise share
    accepts_seed = True  # G and the first global D start from a seed release's (through secure sums)
    target_unit = "per client through secure sums, user-level with a trusted server in the clear"

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def release_spec(self, cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec:
        return release.release_spec(cfg, noise_multiplier=noise_multiplier)

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(
        self, cfg: ExperimentConfig, *, pooled_size: int | None, prior: Sequence[PrivacyEvent] = ()
    ) -> ExperimentConfig:
        if channel_for(cfg).bounds_every_release:  # the per-client ε is finite: calibrate it
            return release.calibrate(cfg, prior=prior)
        if prior:  # in the clear its per-client figure is unbounded: nothing to compose a prior with
            raise ValueError("fedavg-gan in the clear cannot compose releases made before its run")
        return privacy.calibrate(cfg, pooled_size=pooled_size)

    def generator_updates(self, cfg: ExperimentConfig, steps: int) -> int:
        """Each round takes ``server_g_steps`` generator steps."""
        return steps * cfg.server_g_steps

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> FedAvgServer:
        return FedAvgServer(cfg, num_classes, prior)

    def answer(self, node: ClientNode, request: FedAvgRound) -> FedAvgReply:
        """A few local WGAN-GP steps on the received D; the reply is the raw delta, which the
        client's own ledger (and the node's) records as a release without noise (secure
        aggregation: the clipped delta deposited with a noise share, ``release.py``)."""
        cfg, state = node.cfg, node.load_state()
        channel = channel_for(cfg)
        why = channel.session_mismatch(cfg, request.session)
        if why:
            return refusal(FedAvgReply, request.step, state.client_id, why)
        if channel.sums:
            return release.deposit_delta(node, state, request, lambda s: local_delta(cfg, s, request))
        before = state.ledger.copy()
        delta = local_delta(cfg, state, request)
        state.ledger.record(RAW_DELTA)
        state.version += 1
        node.record_release(state, before)
        return FedAvgReply(step=request.step, delta={k: v.contiguous() for k, v in delta.items()})


def local_delta(cfg: ExperimentConfig, state: ClientState, request: FedAvgRound) -> dict[str, torch.Tensor]:
    """This client's local steps on the received D: its raw delta."""
    return client_update(
        request.generator,
        request.discriminator,
        preset=cfg.model,
        num_classes=num_classes_for(cfg),
        z_dim=cfg.z_dim,
        real_images=state.data.images,
        real_labels=state.data.labels,
        local_steps=cfg.local_steps,
        lr=cfg.fedavg_lr_d,
        batch_size=cfg.batch_size,
        gp_weight=cfg.gp_weight,
        drift=cfg.drift,
        optimizer=cfg.fedavg_client_optimizer,
        betas=(cfg.beta1, cfg.beta2),
        scope=cfg.fedavg_delta,
        generator=torch.Generator().manual_seed(request.seed),
        device=resolve_device(cfg.device),
    )


METHOD = FedAvgGan()
