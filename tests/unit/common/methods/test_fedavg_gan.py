"""Fed-Avg GAN's core: a client's local steps (its raw delta) and the server's generator steps.
Tiny models, seeded; exact counters, no loss values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from common.methods.fedavg_gan.client import client_update
from common.methods.fedavg_gan.dp_fedavg import apply_delta, delta_norm
from common.methods.fedavg_gan.server import server_generator_steps
from common.models import build_discriminator, build_generator

Z_DIM, NUM_CLASSES = 10, 10


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _states(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, NUM_CLASSES, (n,), generator=g)


def _client(G: nn.Module, D: nn.Module, n: int = 40) -> dict[str, torch.Tensor]:
    images, labels = _data(n)
    return client_update(
        _states(G), _states(D), preset="tiny", num_classes=NUM_CLASSES, z_dim=Z_DIM,
        real_images=images, real_labels=labels, local_steps=6, batch_size=8, generator=_gen(1),
    )  # fmt: skip


@pytest.fixture(scope="module")
def client_round() -> tuple[dict, dict, dict, dict]:
    """One client_update on tiny models: (G state, D state before, D state after caller, delta)."""
    torch.manual_seed(0)
    G, D = build_generator("tiny", z_dim=Z_DIM), build_discriminator("tiny")
    g_before, d_before = _states(G), _states(D)
    delta = _client(G, D)
    return g_before, d_before, {"G": _states(G), "D": _states(D)}, delta


def test_client_update_changes_d_including_spectral_norm_buffers_and_not_g(client_round) -> None:
    g_before, d_before, after, delta = client_round
    float_keys = {k for k, v in d_before.items() if v.is_floating_point()}
    assert set(delta) == float_keys
    # Power-iteration vectors are buffers and are in the delta; a length-1 u (the 1-output
    # linear layer) is always +-1, so only the longer ones must have moved.
    u_keys = [k for k in delta if k.endswith("_u") and delta[k].numel() > 1]
    assert len(u_keys) >= 3 and all(delta[k].abs().sum() > 0 for k in u_keys)
    assert delta_norm(delta) > 0
    for k, v in after["G"].items():  # the caller's G and D objects are untouched
        assert torch.equal(v, g_before[k])
    for k, v in after["D"].items():
        assert torch.equal(v, d_before[k])


def test_client_update_delta_applies_to_server_d(client_round) -> None:
    _, d_before, _, delta = client_round
    D = build_discriminator("tiny")
    D.load_state_dict(d_before)
    apply_delta(D, delta)
    for k, v in D.state_dict().items():
        torch.testing.assert_close(v, d_before[k] + delta[k])


def test_server_generator_steps_change_g_only() -> None:
    torch.manual_seed(0)
    G, D = build_generator("tiny", z_dim=Z_DIM), build_discriminator("tiny")
    D.train()
    g_before, d_before = _states(G), _states(D)
    stats = server_generator_steps(G, D, steps=3, batch_size=8, z_dim=Z_DIM, num_classes=NUM_CLASSES, generator=_gen(2))
    assert stats["g_steps"] == 3 and math.isfinite(stats["g_loss"])
    assert any(not torch.equal(v, g_before[k]) for k, v in G.state_dict().items())
    for k, v in D.state_dict().items():
        assert torch.equal(v, d_before[k])
    assert D.training and all(p.requires_grad for p in D.parameters())
    assert all(p.grad is None for p in D.parameters())
