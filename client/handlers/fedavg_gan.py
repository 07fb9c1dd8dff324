"""Fed-Avg GAN's client handler: G and D in, the raw D delta out (recorded as unbounded)."""

from __future__ import annotations

import torch
from flwr.app import Context, Message

from common.data import num_classes_for
from common.device import resolve_device
from common.methods.fedavg_gan import MSG_ROUND, RAW_DELTA, FedAvgReply, FedAvgRound, client_update
from protos import wire

from ..node import Node

ACTION = MSG_ROUND


def handle(message: Message, context: Context) -> Message:
    """A few local WGAN-GP steps on the received D; the reply is the raw delta, which the client's
    own ledger records as a release without noise (the server sees it as it is)."""
    node = Node(context)
    refusal = node.refusal()
    if refusal:
        raise RuntimeError(f"this node refuses Fed-Avg GAN rounds: {refusal}")
    round_ = wire.decode(FedAvgRound, message.content)
    cfg, state = node.cfg, node.load_state()
    before = state.ledger.copy()
    delta = client_update(
        round_.generator,
        round_.discriminator,
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
        generator=torch.Generator().manual_seed(round_.seed),
        device=resolve_device(cfg.device),
    )
    state.ledger.record(RAW_DELTA)
    state.version += 1
    node.record_release(state, before)
    reply = FedAvgReply(step=round_.step, delta={k: v.contiguous() for k, v in delta.items()})
    return wire.reply(reply, message)
