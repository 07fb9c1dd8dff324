"""The stacked critic phase: m clients' discriminators stepped as one network end where each would
have ended alone (weights, spectral norm's vectors, Adam's moments and step, the data RNG), and the
answers they release are the same, query by query."""

import copy
import re

import numpy as np
import pytest
import torch

from common.client_state import new_state
from common.io.codec import decode_grads
from common.methods.gswgan.client import ClientDataError, answer_queries, answer_query
from common.methods.gswgan.critic_stack import StackedCritics, stackable
from common.privacy import NodePolicy
from tests.helpers import gs_query, tiny_cfg

ATOL = 2e-5  # float rounding: grouped convolutions and batched products sum in another order


def states_of(cfg, clients=(0, 1, 2)):
    return [new_state(cfg, k, critic_lr=cfg.lr_d) for k in clients]


def assert_same_client(a, b, atol=ATOL):
    for (name, p), q in zip(a.discriminator.named_parameters(), b.discriminator.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=atol, rtol=1e-4, msg=name)
    for (name, u), w in zip(a.discriminator.named_buffers(), b.discriminator.buffers(), strict=True):
        torch.testing.assert_close(u, w, atol=atol, rtol=1e-4, msg=name)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        assert float(sa[i]["step"]) == float(sb[i]["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sa[i][key], sb[i][key], atol=atol, rtol=1e-3)
    assert torch.equal(a.data_rng.get_state(), b.data_rng.get_state())  # the same draws, in the same order
    assert a.ledger.state_dict() == b.ledger.state_dict() and a.version == b.version


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_stacked_scores_are_each_clients_own(model):
    cfg = tiny_cfg(model=model, num_clients=3)
    states = states_of(cfg)
    x = torch.rand(3, 5, 1, 28, 28)
    y = torch.randint(10, (3, 5))
    alone = torch.stack([s.discriminator(x[k], y[k]) for k, s in enumerate(copy.deepcopy(states))])
    torch.testing.assert_close(StackedCritics(states).scores(x, y), alone, atol=ATOL, rtol=1e-4)


def test_m_clients_stepped_together_end_where_each_would_alone():
    """Two queries in a row (the second finds Adam's state from the first), clients with different
    step counts (client 2 answered once before, alone), warm starts on first contact."""
    cfg = tiny_cfg(num_clients=3, n_critic=3, warmup_steps=4, noise_seed=7, wire_dtype="float32")
    together, alone = states_of(cfg), states_of(cfg)
    policy = NodePolicy(allow_nonprivate=True)
    for group in (together, alone):
        answer_query(group[2], cfg, gs_query(cfg, step=0), policy)
    for step in (1, 2):
        query = gs_query(cfg, step=step)
        stacked = answer_queries(together, cfg, [query] * 3, [policy] * 3)
        one_by_one = [answer_query(s, cfg, query, policy) for s in alone]
        for a, b in zip(stacked, one_by_one, strict=True):
            assert not a.refused and a.noise_multiplier == b.noise_multiplier
            ga, gb = (decode_grads(x.grad, x.grad_encoding, batch_size=cfg.batch_size) for x in (a, b))
            # the same noise (seeded here), so the released gradients differ by rounding only
            np.testing.assert_allclose(ga, gb, atol=1e-5)
    for a, b in zip(together, alone, strict=True):
        assert_same_client(a, b)


def test_refusals_and_unstackable_clients_go_their_own_way():
    cfg = tiny_cfg(num_clients=3)
    states = states_of(cfg)
    query = gs_query(cfg)
    wrong_b = gs_query(cfg.replace(batch_size=cfg.batch_size + 1))
    answers = answer_queries(states, cfg, [query, wrong_b, query], [NodePolicy()] * 3)
    assert [a.refused for a in answers] == [False, True, False]
    assert "B = " in answers[1].reason and states[1].ledger.queries == 0
    assert states[0].ledger.queries == states[2].ledger.queries == 1
    assert not stackable(states[:1])  # one client: nothing to stack
    states[0].discriminator.eval()
    assert not stackable(states)  # eval mode would not advance the power iteration


def test_stack_clients_off_answers_one_by_one(monkeypatch):
    from common.methods.gswgan import client

    monkeypatch.setattr(client, "stacked_critic_phase", lambda *a: pytest.fail("stacked although stack_clients=False"))
    cfg = tiny_cfg(num_clients=3, stack_clients=False)
    answers = answer_queries(states_of(cfg), cfg, [gs_query(cfg)] * 3, [NodePolicy()] * 3)
    assert [a.refused for a in answers] == [False, False, False]


def _small_partition(state, cfg):
    state.data.images, state.data.labels = state.data.images[:5], state.data.labels[:5]


def _label_out_of_range(state, cfg):
    state.data.labels = state.data.labels.clone()
    state.data.labels[0] = 99


def _wrong_image_size(state, cfg):  # no check names it: it breaks the stacked phase itself
    state.data.images = state.data.images[:, :, :14, :14].contiguous()


@pytest.mark.parametrize(
    ("breaking", "cause"),
    [
        (_small_partition, r"client 1 cannot answer: its partition holds 5 images, fewer than batch_size=8"),
        (_label_out_of_range, r"client 1 cannot answer: its partition has labels in \[0, 99\], outside \[0, 10\)"),
        (_wrong_image_size, r"."),
    ],
)
def test_a_broken_client_fails_alone_and_the_others_end_as_they_would_alone(breaking, cause):
    """Issue 23, item 12: one client whose own data breaks its answer once failed every client of its
    stacked step (with m = K the run stopped). Now its error takes its place; the others are answered,
    and end (weights, Adam, data RNG, ledger) where they would have alone."""
    cfg = tiny_cfg(num_clients=3, n_critic=2, noise_seed=7, wire_dtype="float32")
    together, alone = states_of(cfg), states_of(cfg)
    breaking(together[1], cfg)
    policy, query = NodePolicy(allow_nonprivate=True), gs_query(cfg)
    answers = answer_queries(together, cfg, [query] * 3, [policy] * 3)
    assert isinstance(answers[1], Exception) and re.search(cause, str(answers[1])), answers[1]
    assert isinstance(answers[1], ClientDataError) == (breaking is not _wrong_image_size)
    assert together[1].ledger.queries == 0  # it released nothing
    for k in (0, 2):
        expected = answer_query(alone[k], cfg, query, policy)
        ga, gb = (decode_grads(x.grad, x.grad_encoding, batch_size=cfg.batch_size) for x in (answers[k], expected))
        np.testing.assert_allclose(ga, gb, atol=1e-5)
        assert_same_client(together[k], alone[k])
