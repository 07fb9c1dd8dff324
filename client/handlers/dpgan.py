"""Centralized DPGAN's client handler: the curator runs a round, or refuses it under its budget."""

from __future__ import annotations

import json

from flwr.app import Context, Message

from common.methods.dpgan import (
    MSG_ROUND,
    DpganNode,
    DpganReply,
    DpganRound,
    load_node,
    pooled_charges,
    run_round,
    save_node,
)
from common.models import on_cpu
from common.privacy.node_ledger import charge_node, read_node_book
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
    refusal = node.refusal() or _round_refusal(node, curator, planned)
    if refusal:
        reply.refused, reply.reason = True, f"the DPGAN node refuses: {refusal}"
        return wire.reply(reply, message)
    before = curator.ledger.copy()
    stats = run_round(curator, node.cfg)
    # Every pooled client's data took part in each step: each node ledger is charged in its unit
    # before G leaves the curator.
    charge_node(node.state_dir, pooled_charges(curator, curator.ledger.since(before)), method=node.cfg.strategy)
    save_node(curator, node.state_dir)
    reply.n_d = curator.n_d
    reply.discriminator_steps, reply.ledger = curator.trainer.steps_taken, json.dumps(curator.ledger.state_dict())
    reply.stats = stats
    reply.generator = on_cpu(curator.generator.state_dict())
    return wire.reply(reply, message)


def _round_refusal(node: Node, curator: DpganNode, planned: int) -> str:
    """Why the curator refuses the next round (""): its noise below the node's minimum; the run's
    budget, example-level, on the curator's own ledger; the node's budget, in its unit, on the node
    ledger of each pooled client (what the round would cost that client's whole partition)."""
    cfg, policy, event = node.cfg, node.policy, curator.step_event(planned)
    what = f"{planned} more DP-SGD steps"
    problem = policy.check_release(event.noise_multiplier, what)
    if problem:
        return problem
    run_budget = cfg.client_epsilon_budget
    if run_budget > 0 and curator.ledger.would_exceed(budget=run_budget, delta=cfg.delta, next_event=event):
        return f"{what} would exceed the run's example-level epsilon budget {run_budget:g} at delta {cfg.delta:g}"
    if policy.max_epsilon > 0:
        for client, (cost,) in pooled_charges(curator, [event]).items():
            book = read_node_book(node.state_dir, client).ledger
            if book.would_exceed(budget=policy.max_epsilon, delta=policy.delta, next_event=cost):
                return (
                    f"{what} would exceed the node's epsilon budget {policy.max_epsilon:g} at delta {policy.delta:g} "
                    f"for pooled client {client} (its {curator.sizes[client]} examples in every step: noise "
                    f"multiplier {cost.noise_multiplier:.3g} per step for its whole data set)"
                )
    return ""
