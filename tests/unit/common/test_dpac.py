"""DPAC (the dual-purpose auxiliary classifier): its gradient math, C's training modes, and the
federated form's privacy (one sanitized release, the same ledger event as GS-WGAN's)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from client import state as client_state
from common.config import ConfigError
from common.io.codec import decode_grads
from common.learning.dpac import (
    TRAIN_MODES,
    build_classifier,
    classifier_adam,
    combined_sample_grads,
    train_classifier,
)
from common.learning.losses import generator_sample_grads
from common.methods import ExperimentConfig
from common.methods.gswgan.client import answer_query
from common.methods.gswgan.critic import first_contact
from common.privacy import NodePolicy
from tests.helpers import gs_query


class TwoPixelCritic(nn.Module):
    """D(x, y) = <w, x>: its input gradient is w."""

    def __init__(self, w: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.w


class TwoPixelClassifier(nn.Module):
    """Logits A x for two classes: the cross-entropy's input gradient is A^T (softmax(Ax) - e_y)."""

    def __init__(self, a: list[list[float]]) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.a.T


def test_combined_gradient_by_hand_on_two_pixels():
    # x = (1, 0), label 0, A = I: logits (1, 0), softmax (e/(e+1), 1/(e+1)); w = (2, -1).
    D, C = TwoPixelCritic([2.0, -1.0]), TwoPixelClassifier([[1.0, 0.0], [0.0, 1.0]])
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
    p = 1 / (math.e + 1)  # softmax of the other class for the first sample
    ce0 = torch.tensor([-p, p])  # A^T (softmax - e_0) at x = (1, 0)
    ce1 = torch.tensor([-(1 - p), 1 - p])  # at x = (0, 1): logits (0, 1), softmax (p, 1 - p)
    minus_w = torch.tensor([-2.0, 1.0])
    for beta in (0.0, 0.25, 0.5, 1.0):
        grads = combined_sample_grads(D, C, x, y, beta)
        expected = torch.stack([beta * minus_w + (1 - beta) * ce0, beta * minus_w + (1 - beta) * ce1])
        torch.testing.assert_close(grads, expected)


def test_beta_one_or_no_classifier_is_gs_wgan_exactly():
    torch.manual_seed(0)
    D = TwoPixelCritic([0.3, -0.7])
    x, y = torch.rand(4, 2), torch.randint(0, 2, (4,))
    gs = generator_sample_grads(D, x, y)
    torch.testing.assert_close(combined_sample_grads(D, None, x, y, 0.3), gs)
    torch.testing.assert_close(combined_sample_grads(D, TwoPixelClassifier([[1.0, 2.0], [3.0, 4.0]]), x, y, 1.0), gs)


def test_combined_gradient_is_per_sample_on_the_real_networks():
    torch.manual_seed(0)
    from common.learning.models import build_discriminator

    D, C = build_discriminator("tiny").eval(), build_classifier("tiny", num_classes=10)  # eval: no power iteration
    x, y = torch.rand(5, 1, 28, 28), torch.randint(0, 10, (5,))
    grads = combined_sample_grads(D, C, x, y, 0.4)
    for i in range(5):
        alone = combined_sample_grads(D, C, x[i : i + 1], y[i : i + 1], 0.4)
        torch.testing.assert_close(grads[i : i + 1], alone, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in [*D.parameters(), *C.parameters()])


@pytest.mark.parametrize(("mode", "steps"), [("seq", 2), ("joint", 1), ("real", 1), ("fake", 1)])
def test_each_training_mode_takes_its_steps_on_its_data(mode, steps):
    torch.manual_seed(0)
    C = build_classifier("tiny", num_classes=10)
    opt = classifier_adam(C, 1e-3)
    real, real_y = torch.rand(4, 1, 28, 28), torch.zeros(4, dtype=torch.long)
    fake, fake_y = torch.rand(4, 1, 28, 28), torch.ones(4, dtype=torch.long)
    train_classifier(C, opt, mode, real, real_y, fake, fake_y)
    assert next(iter(opt.state.values()))["step"].item() == steps
    assert set(TRAIN_MODES) == {"seq", "joint", "real", "fake"}


def test_classifier_learns_real_labels():
    torch.manual_seed(0)
    C = build_classifier("tiny", num_classes=2)
    opt = classifier_adam(C, 1e-2)
    x = torch.cat([torch.zeros(16, 1, 28, 28), torch.ones(16, 1, 28, 28)])
    y = torch.cat([torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long)])
    for _ in range(30):
        train_classifier(C, opt, "real", x, y, x, y)
    assert (C(x).argmax(1) == y).float().mean().item() == 1.0


@pytest.fixture
def cfg():
    return ExperimentConfig(
        num_clients=2, model="tiny", batch_size=8, n_critic=2, synthetic_samples_per_writer=24, noise_seed=5
    )


def test_a_dpac_answer_is_one_release_with_gs_wgans_event(cfg):
    """The same query, with and without DPAC: one ledger entry each, the same mechanism; the
    gradients differ (C's term), and every released row is clipped before the noise."""
    answers, events = {}, {}
    for beta in (1.0, 0.5):
        c = cfg.replace(dpac_beta=beta, dpac_init=3, noise_multiplier=0.0)
        state = client_state.new_state(c, 1, critic_lr=c.lr_d)
        answers[beta] = answer_query(state, c, gs_query(c), NodePolicy(allow_nonprivate=True))  # σ = 0
        assert state.ledger.queries == 1
        events[beta] = state.ledger.history[-1]
        assert (state.classifier is not None) == (beta < 1)
    assert events[1.0] == events[0.5]
    g = {b: decode_grads(a.grad, a.grad_encoding, batch_size=8).astype(np.float32) for b, a in answers.items()}
    assert not np.allclose(g[1.0], g[0.5])
    assert np.linalg.norm(g[0.5].reshape(8, -1), axis=1).max() <= cfg.clip * (1 + 1e-3)


def test_first_contact_trains_c_on_real_data_without_privacy_cost(cfg):
    c = cfg.replace(dpac_beta=0.5, dpac_init=4)
    state = client_state.new_state(c, 0, critic_lr=c.lr_d)
    before = [p.detach().clone() for p in state.classifier.parameters()]
    first_contact(state, c)
    assert state.classifier_ready and state.ledger.queries == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, state.classifier.parameters(), strict=True))


def test_the_classifier_survives_a_new_process(cfg, tmp_path):
    c = cfg.replace(dpac_beta=0.5, dpac_init=2)
    state = client_state.new_state(c, 1, critic_lr=c.lr_d)
    answer_query(state, c, gs_query(c, 0))
    client_state.save_state(state, tmp_path)
    client_state.clear_cache()
    loaded = client_state.load_state(c, 1, tmp_path, version=state.version, critic_lr=c.lr_d)
    assert loaded.classifier_ready
    for a, b in zip(state.classifier.state_dict().values(), loaded.classifier.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    a, b = answer_query(state, c, gs_query(c, 1)), answer_query(loaded, c, gs_query(c, 1))
    np.testing.assert_array_equal(a.grad, b.grad)


def test_dpac_options_are_checked_at_the_boundary():
    with pytest.raises(ConfigError, match="dpac_beta"):
        ExperimentConfig(dpac_beta=1.5)
    with pytest.raises(ConfigError, match="dpac_train"):
        ExperimentConfig(dpac_train="sometimes")
    with pytest.raises(ConfigError, match="fedavg-gan has no DPAC form"):
        ExperimentConfig(strategy="fedavg-gan", dpac_beta=0.5)
