"""DPGAN's curator node answering a round: n_D DP steps and one generator step, charged to every
pooled client's node ledger before G's weights and the curator's ledger go back; or a refusal,
when the round's noise is below the node's minimum or a budget would be exceeded."""

from __future__ import annotations

import json

from common.learning.models import on_cpu
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.node_ledger import read_node_book

from ..protocol import ClientNode, refusal
from .curator import CURATOR, DpganNode, pooled_charges, run_round
from .messages import DpganReply, DpganRound
from .storage import load_node, save_node


def answer_round(node: ClientNode, request: DpganRound) -> DpganReply:
    """The curator's round, unless it refuses it; G's weights and its whole ledger go back."""
    cfg = node.cfg
    curator = load_node(cfg, node.state_dir, rounds=request.step)
    why = round_refusal(node, curator)
    if why:
        return refusal(DpganReply, request.step, CURATOR, why)
    before = curator.ledger.copy()
    stats = run_round(curator, cfg)
    # Every pooled client's data took part in each step: each node ledger is charged in its unit
    # before G leaves the curator.
    node.charge(pooled_charges(curator, curator.ledger.since(before)))
    save_node(curator, node.state_dir)
    return DpganReply(
        step=request.step,
        noise_multiplier=curator.trainer.noise_multiplier,
        sample_rate=curator.sample_rate,
        n_d=curator.n_d,
        discriminator_steps=curator.trainer.steps_taken,
        ledger=json.dumps(curator.ledger.state_dict()),
        stats=stats,
        generator=on_cpu(curator.generator.state_dict()),
    )


def round_refusal(node: ClientNode, curator: DpganNode) -> str:
    """Why the curator refuses the next round (""): its noise (a seeded run's first round: the seed
    release's too) below the node's minimum; the run's budget, example-level, on the curator's own
    ledger; the node's budget, in its unit, on the node ledger of each pooled client (what the round
    would cost that client's whole partition)."""
    cfg, policy, events = node.cfg, node.policy, curator.round_events(node.cfg)
    steps = f"{events[-1].count} more DP-SGD steps"
    names = ["the seed release"] * (len(events) - 1) + [steps]  # round_events: the seed, if any, first
    what = " and ".join(names)
    for event, name in zip(events, names, strict=True):
        problem = policy.check_release(event.noise_multiplier, name)
        if problem:
            return problem
    run_budget = cfg.client_epsilon_budget
    if run_budget > 0 and would_exceed(curator.ledger, events, budget=run_budget, delta=cfg.delta):
        return f"{what} would exceed the run's example-level epsilon budget {run_budget:g} at delta {cfg.delta:g}"
    if policy.max_epsilon > 0:
        for client, costs in pooled_charges(curator, events).items():
            book = read_node_book(node.state_dir, client).ledger
            if would_exceed(book, costs, budget=policy.max_epsilon, delta=policy.delta):
                return (
                    f"{what} would exceed the node's epsilon budget {policy.max_epsilon:g} at delta {policy.delta:g} "
                    f"for pooled client {client} (its {curator.sizes[client]} examples in every step: noise "
                    f"multiplier {costs[-1].noise_multiplier:.3g} per step for its whole data set)"
                )
    return ""


def would_exceed(ledger: PrivacyLedger, events: list[PrivacyEvent], *, budget: float, delta: float) -> bool:
    """Whether ``events``, in order after ``ledger``, would take it past ``budget``."""
    trial = ledger.copy()
    for event in events[:-1]:
        trial.record(event)
    return trial.would_exceed(budget=budget, delta=delta, next_event=events[-1])
