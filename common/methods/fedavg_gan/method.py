"""Fed-Avg GAN as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from common.data import num_classes_for
from common.device import resolve_device

from ..base import MethodBase
from ..protocol import ClientNode, PriorReleases, refusal
from ..secure_sums import session_mismatch
from . import options, privacy, secure
from .client import client_update
from .messages import MESSAGES, FedAvgReply, FedAvgRound
from .privacy import RAW_DELTA
from .server import FedAvgServer

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig


class FedAvgGan(MethodBase):
    name = options.NAME
    options = options.Options
    messages = MESSAGES
    step_label = "rounds"
    unbounded_against_server = True  # clients send raw deltas: a node with a finite max-epsilon refuses
    supports_secure_aggregation = True  # a round's deltas summed securely, each client adding a noise share

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def check_run(self, cfg: ExperimentConfig) -> None:
        options.check_run(cfg)

    def release_noise(self, cfg: ExperimentConfig) -> float:
        if cfg.secure_aggregation:  # the node's own share: z/√t
            return cfg.fedavg_noise_multiplier / math.sqrt(secure.fewest_survivors(cfg) - cfg.secagg_colluders)
        return privacy.release_noise(cfg)

    def protocol_release_noise(self, cfg: ExperimentConfig) -> float:
        return cfg.fedavg_noise_multiplier if cfg.secure_aggregation else 0.0

    def secure_cohort(self, cfg: ExperimentConfig) -> int:
        """A round's m clients."""
        return cfg.fedavg_clients_per_round if cfg.secure_aggregation else 0

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(self, cfg: ExperimentConfig, *, pooled_size: int | None) -> ExperimentConfig:
        if cfg.secure_aggregation:
            return secure.calibrate(cfg)
        return privacy.calibrate(cfg, pooled_size=pooled_size)

    def generator_updates(self, cfg: ExperimentConfig, steps: int) -> int:
        """Each round takes ``server_g_steps`` generator steps."""
        return steps * cfg.server_g_steps

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> FedAvgServer:
        return FedAvgServer(cfg, num_classes)

    def answer(self, node: ClientNode, request: FedAvgRound) -> FedAvgReply:
        """A few local WGAN-GP steps on the received D; the reply is the raw delta, which the
        client's own ledger (and the node's) records as a release without noise (secure
        aggregation: the clipped delta deposited with a noise share, ``secure.py``)."""
        cfg, state = node.cfg, node.load_state()
        why = session_mismatch(cfg, request.session)
        if why:
            return refusal(FedAvgReply, request.step, state.client_id, why)
        if request.session:
            return secure.secure_answer(node, state, request, lambda s: local_delta(cfg, s, request))
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
