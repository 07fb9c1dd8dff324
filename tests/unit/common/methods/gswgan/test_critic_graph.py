"""The critic phase in a slot (common/methods/gswgan/critic_graph.py): clients copied into one template network
and back end where their eager steps would have left them, query after query, clients taking
turns in the slot, warm starts included, and release the same answers.

On the CPU the slot runs its bodies without capture (the copy in and out, the RNG order, Adam's
step count are what is tested); with a GPU the captured graphs are compared with the eager steps
too (skipped here, run on the lent GPU machine)."""

import numpy as np
import pytest
import torch

from common.client_state import new_state
from common.io.codec import decode_grads
from common.methods.gswgan import critic_graph
from common.methods.gswgan.client import answer_query
from common.privacy import NodePolicy
from tests.helpers import gs_query, tiny_cfg
from tests.unit.common.methods.gswgan.test_critic_stack import assert_same_client

POLICY = NodePolicy(allow_nonprivate=True)


def cfg_for(device="cpu", model="tiny"):
    return tiny_cfg(
        model=model, device=device, num_clients=2, n_critic=3, warmup_steps=7, noise_seed=7, wire_dtype="float32"
    )


def run_queries(cfg, states, steps=3):
    """Clients 0 and 1 take turns (each load finds the other's weights in the slot)."""
    answers = []
    for step in range(steps):
        for state in states:
            answer = answer_query(state, cfg, gs_query(cfg, step=step), POLICY)
            assert not answer.refused, answer.reason
            answers.append(decode_grads(answer.grad, answer.grad_encoding, batch_size=cfg.batch_size))
    return answers


def compare_slot_with_eager(monkeypatch, cfg, atol, *, relative=False):
    """``relative``: compare the releases by relative norm (below 1e-3) and leave the weights to
    the tiny model's elementwise checks. Adam turns float rounding in a near-zero gradient into a
    step of size lr in either direction, so after a few steps of the paper's 1M-parameter D the
    eager and captured weights differ coordinate by coordinate by more than rounding, not in sum."""
    eager = [new_state(cfg, k, critic_lr=cfg.lr_d) for k in range(2)]
    expected = run_queries(cfg, eager)
    slotted = [new_state(cfg, k, critic_lr=cfg.lr_d) for k in range(2)]
    monkeypatch.setattr(critic_graph, "use_graphs", lambda state, cfg, b: critic_graph.graphable(state))
    got = run_queries(cfg, slotted)
    for a, b in zip(got, expected, strict=True):  # the same noise (seeded), so rounding only
        if relative:
            assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
        else:
            np.testing.assert_allclose(a, b, atol=atol)
    for a, b in zip(slotted, eager, strict=True):
        assert a.warmed_up and b.warmed_up
        if not relative:
            assert_same_client(a, b, atol=atol)
        assert torch.equal(a.data_rng.get_state(), b.data_rng.get_state())


def test_clients_taking_turns_in_a_slot_end_where_their_eager_steps_would(monkeypatch):
    compare_slot_with_eager(monkeypatch, cfg_for(), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the lent GPU machine)")
@pytest.mark.parametrize("model", ["tiny", "paper"])
def test_captured_graphs_match_the_eager_steps_on_cuda(monkeypatch, model):
    # TF32 (on by default for cuDNN) rounds to 10 mantissa bits, and the captured and eager steps may
    # pick other convolution algorithms: full float32 so that only float32 rounding is left.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cfg = cfg_for("cuda", model)
    compare_slot_with_eager(monkeypatch, cfg, atol=1e-4, relative=model == "paper")
    key = next(
        k
        for k in critic_graph._SLOTS
        if k.device.startswith("cuda") and k.spec == new_state(cfg, 0, critic_lr=cfg.lr_d).discriminator.spec
    )
    assert key.capture and critic_graph._SLOTS[key].critic_graph is not None


def test_an_error_inside_the_session_leaves_the_client_as_it_was():
    cfg = cfg_for()
    state = new_state(cfg, 0, critic_lr=cfg.lr_d)
    before = [p.detach().clone() for p in state.discriminator.parameters()]
    B = cfg.batch_size
    x, y = torch.rand(B, 1, 28, 28), torch.randint(10, (B,))
    with pytest.raises(RuntimeError, match="mid-phase"):
        with critic_graph.critic_session(state, cfg, B, slot=True, capture=False) as critic:
            critic.critic_step(x, y, x, y, torch.rand(B, 1, 1, 1))
            raise RuntimeError("mid-phase")
    for p, q in zip(state.discriminator.parameters(), before, strict=True):
        assert torch.equal(p, q)
    assert not state.optimizer.state  # Adam never stepped on the client's own objects


def test_only_plain_clients_use_a_slot():
    cfg = cfg_for()
    assert critic_graph.graphable(new_state(cfg, 0, critic_lr=cfg.lr_d))
    assert not critic_graph.use_graphs(new_state(cfg, 0, critic_lr=cfg.lr_d), cfg, cfg.batch_size)  # the CPU: no graphs
    assert not critic_graph.graphable(
        new_state(cfg.replace(dpac_beta=0.5), 0, critic_lr=cfg.lr_d)
    )  # DPAC's C interleaves
    with critic_graph.critic_session(new_state(cfg, 0, critic_lr=cfg.lr_d), cfg, cfg.batch_size) as critic:
        assert isinstance(critic, critic_graph.EagerCritic)
