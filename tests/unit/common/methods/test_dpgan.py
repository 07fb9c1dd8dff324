"""Centralized DPGAN's core: the curator's secret Poisson batches, its events, its options."""

from __future__ import annotations

import json
import os

import pytest
import torch

from common.learning.models import build_generator
from common.methods import ExperimentConfig
from common.methods.dpgan.curator import new_node
from common.methods.dpgan.messages import DpganReply
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.node_ledger import NODE_STATE_ENV, read_node_book
from common.privacy.sampling import VOID_SAMPLING_SEED
from protos import wire
from server.strategy import Incoming
from tests.helpers import cut_short, drop_first, federation, make_strategy, one_step, tiny_cfg


def _node_cfg(**changes) -> ExperimentConfig:
    return ExperimentConfig(
        strategy="dpgan", num_clients=2, model="tiny", synthetic_samples_per_writer=40, dpgan_batch_size=16, **changes
    )


def test_curator_batches_are_secret_unless_the_testing_flag_says_otherwise() -> None:
    """The run's seed is published in config.json: two curators of the same run must not draw the
    same Poisson batches, or amplification at q = B/N would not hold. --sampling-seed reproduces
    them, and marks every step void."""
    a, b = new_node(_node_cfg(seed=0)), new_node(_node_cfg(seed=0))
    draws = [[n.sampler.poisson(len(n.labels), n.sample_rate).tolist() for _ in range(5)] for n in (a, b)]
    assert draws[0] != draws[1] and a.void == ""
    c, d = new_node(_node_cfg(sampling_seed=4)), new_node(_node_cfg(sampling_seed=4))
    assert torch.equal(c.sampler.poisson(80, 0.2), d.sampler.poisson(80, 0.2))
    assert c.void == VOID_SAMPLING_SEED and c.step_event(3).void == VOID_SAMPLING_SEED


# --- the server side (through the server's shell: replies as a transport hands them) ---------------
def test_dpgan_takes_the_curators_generator_and_ledger(tmp_path):
    cfg, s = make_strategy("dpgan")
    (out,) = s.configure_step(0, [101, 102, 103][:1])
    gen = build_generator("tiny")
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5)])
    reply = wire.encode(
        DpganReply(
            step=0,
            refused=False,
            reason="",
            noise_multiplier=1.0,
            sample_rate=0.1,
            n_d=5,
            discriminator_steps=5,
            ledger=json.dumps(ledger.state_dict()),
            stats={"g_loss": 0.5},
            generator=gen.state_dict(),
        )
    )
    outcome = s.aggregate_step(0, [Incoming(101, reply)])
    assert outcome.took_step
    for a, b in zip(gen.state_dict().values(), s.side.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    report = s.privacy_report(final=True)
    # The reply's ledger covers every step so far: it replaces the charge made when the round was sent.
    assert report["clients"][0]["epsilon"] == pytest.approx(ledger.epsilon(delta=cfg.delta))
    assert report["parameters"]["discriminator_steps"] == 5
    assert s.select_nodes([102, 101, 103]) == [101]  # only the curator (client 0) is ever asked


def dpgan_reply(step, ledger):
    return wire.encode(
        DpganReply(
            step=step,
            refused=False,
            reason="",
            noise_multiplier=1.0,
            sample_rate=0.1,
            n_d=5,
            discriminator_steps=ledger.queries,
            ledger=json.dumps(ledger.state_dict()),
            stats={},
            generator=build_generator("tiny").state_dict(),
        )
    )


def test_dpgan_a_curator_ledger_that_goes_backwards_never_lowers_the_reported_epsilon(tmp_path):
    """Audit: deleting the curator's state file and resuming made the reported ε fall (1.743 ->
    1.661) while the released G depends on every DP step. The lost steps stay counted."""
    cfg, s = make_strategy("dpgan")
    step5 = PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5, sampling="poisson")
    notes = []
    for step, count in enumerate((5, 10, 5)):  # the third reply: a curator that lost its state
        s.configure_step(step, [101])
        notes += s.aggregate_step(step, [Incoming(101, dpgan_reply(step, PrivacyLedger([step5.times(count)])))]).notes
    all_steps = PrivacyLedger([step5.times(15)])
    reported = s.privacy_report(final=True)["clients"][0]["epsilon"]
    assert reported == pytest.approx(all_steps.epsilon(delta=cfg.delta))
    assert reported > PrivacyLedger([step5.times(10)]).epsilon(delta=cfg.delta)
    assert any("went backwards" in n for n in notes)
    # and it survives a checkpoint
    _, again = make_strategy("dpgan")
    again.load_state_dict(s.state_dict())
    assert again.privacy_report(final=True)["clients"][0]["epsilon"] == pytest.approx(reported)


def _g_all_nan(state):
    return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}


@pytest.mark.parametrize(
    ("forge", "cause"),
    [(cut_short, "of shape"), (drop_first, "missing ["), (_g_all_nan, "NaN or infinite")],
)
def test_dpgan_refuses_a_generator_that_cannot_be_g_and_keeps_its_own(tmp_path, forge, cause):
    """Issue 23, item 15: a wrong-shape or missing tensor in the curator's G crashed the run (load_state_dict);
    an all-NaN G was taken, and its EMA released as completed."""
    cfg, s = make_strategy("dpgan")
    s.configure_step(0, [101])
    before = {k: v.clone() for k, v in s.released_generator().state_dict().items()}
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5)])
    reply = DpganReply(
        step=0,
        refused=False,
        reason="",
        noise_multiplier=1.0,
        sample_rate=0.1,
        n_d=5,
        discriminator_steps=5,
        ledger=json.dumps(ledger.state_dict()),
        generator=forge(build_generator("tiny").state_dict()),
    )
    outcome = s.aggregate_step(0, [Incoming(101, wire.encode(reply))])
    assert not outcome.took_step and outcome.failed_nodes == [101]
    (note,) = outcome.notes
    assert "malformed reply" in note and cause in note, note
    for k, v in s.released_generator().state_dict().items():
        assert torch.equal(v, before[k]), k
    assert s.side.records.ledger_of(0).queries == cfg.dpgan_n_d  # the round sent stays charged


# --- the client side (through the client's shell: real nodes in this process) ---------------------
def test_the_curators_round_is_charged_to_every_pooled_clients_node_ledger(tmp_path):
    """The curator pools every partition: each pooled client's node ledger holds the round's DP
    steps in its own unit before G leaves the curator."""
    cfg = tiny_cfg(tmp_path, strategy="dpgan", dpgan_batch_size=16, dpgan_n_d=2)
    transport, nodes = federation(cfg)
    strategy, outcome = one_step(cfg, transport, nodes, asked=[0])
    assert outcome.took_step and strategy.side.records.ledger_of(0).queries == 2
    root = os.environ[NODE_STATE_ENV]
    assert [read_node_book(root, k).ledger.queries for k in range(3)] == [2, 2, 2]
