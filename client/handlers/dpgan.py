"""Centralized DPGAN's client handler: the curator runs a round, or refuses it under its budget."""

from __future__ import annotations

import json

from flwr.app import Context, Message

from common.methods.dpgan import MSG_ROUND, DpganReply, DpganRound, load_node, run_round, save_node
from common.models import on_cpu
from protos import wire

from ..node import Node, use_client_threads

ACTION = MSG_ROUND


def handle(message: Message, context: Context) -> Message:
    """n_D DP steps and one generator step on the curator; G's weights and its ledger go back."""
    node = Node(context)
    step = wire.decode(DpganRound, message.content).step
    use_client_threads()
    curator = load_node(node.cfg, node.state_dir, rounds=step)
    reply = DpganReply(
        step=step,
        refused=False,
        reason="",
        noise_multiplier=curator.trainer.noise_multiplier,
        sample_rate=curator.sample_rate,
    )
    planned = curator.round_dp_steps(node.cfg)
    event = curator.step_event(planned)
    refusal = node.refusal() or node.policy.release_refusal(
        curator.ledger, event, node.cfg, f"{planned} more DP-SGD steps"
    )
    if refusal:
        reply.refused, reply.reason = True, f"the DPGAN node refuses: {refusal}"
        return wire.reply(reply, message)
    stats = run_round(curator, node.cfg)
    save_node(curator, node.state_dir)
    reply.n_d = curator.n_d
    reply.discriminator_steps, reply.ledger = curator.trainer.steps_taken, json.dumps(curator.ledger.state_dict())
    reply.stats = stats
    reply.generator = on_cpu(curator.generator.state_dict())
    return wire.reply(reply, message)
