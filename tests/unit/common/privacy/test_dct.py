"""``--grad-dct``: the public basis, the mechanism on coefficients, and the server's lift back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common import client_state
from common.io.codec import PayloadError, decode_grads
from common.methods import ExperimentConfig
from common.methods.gswgan.client import answer_query
from common.methods.gswgan.generator import ServerGenerator
from common.methods.gswgan.messages import validate_answer
from common.privacy.dct import dct_basis, to_coefficients, to_pixels
from tests.helpers import gs_query


@pytest.mark.parametrize("keep", [1, 8, 28])
def test_the_basis_has_orthonormal_columns(keep: int) -> None:
    P = dct_basis(keep).double()
    assert P.shape == (784, keep * keep)
    torch.testing.assert_close(P.T @ P, torch.eye(keep * keep, dtype=torch.float64), atol=1e-5, rtol=0)


def test_the_full_basis_is_lossless_and_a_partial_one_keeps_smooth_images() -> None:
    g = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(to_pixels(to_coefficients(g, 28), 28), g, atol=1e-4, rtol=0)
    y, x = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    smooth = torch.exp(-((x - 13.5) ** 2 + (y - 13.5) ** 2) / 60.0).reshape(1, 1, 28, 28)
    back = to_pixels(to_coefficients(smooth, 8), 8)
    assert (back - smooth).norm() / smooth.norm() < 0.02  # a blob lives in the low frequencies
    assert to_coefficients(g, 8).norm() < g.norm()  # P^T never lengthens a vector: clipping still bounds it


@pytest.fixture
def cfg():
    return ExperimentConfig(
        num_clients=2, model="tiny", batch_size=8, n_critic=1, synthetic_samples_per_writer=24, grad_dct=6
    )


def test_a_client_releases_clipped_noised_coefficients_with_the_same_privacy_event(cfg) -> None:
    state = client_state.new_state(cfg, 1, critic_lr=cfg.lr_d)
    answer = answer_query(state, cfg, gs_query(cfg))
    coeffs = decode_grads(answer.grad, answer.grad_encoding, batch_size=8, coords=36)
    assert coeffs.shape == (8, 36)
    assert answer.noise_multiplier == pytest.approx(cfg.noise_multiplier / np.sqrt(8))  # as on pixels
    assert state.ledger.history[-1].noise_multiplier == answer.noise_multiplier
    assert np.linalg.norm(coeffs, axis=1).mean() > 2 * cfg.noise_multiplier * cfg.clip  # the noise is there


def test_the_server_refuses_pixels_when_it_expects_coefficients(cfg) -> None:
    raw = cfg.replace(grad_dct=0, wire_compression="none")
    pixels = answer_query(client_state.new_state(raw, 1, critic_lr=raw.lr_d), raw, gs_query(raw))
    with pytest.raises(PayloadError, match="grad"):
        validate_answer(pixels, batch_size=8, step=pixels.step, coords=36)


def test_the_server_backpropagates_the_lifted_gradient(cfg) -> None:
    server = ServerGenerator(cfg, num_classes=10)
    _, _, attached = server.query_batches(8, 0)
    coeffs = torch.randn(8, 36, generator=torch.Generator().manual_seed(1))
    params = list(server.model.parameters())
    want = torch.autograd.grad((attached * to_pixels(coeffs, 6)).sum() / 8.0, params, retain_graph=True)
    server.apply([attached], [coeffs], divisor=8.0)
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, w)


def test_grad_dct_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="grad_dct"):
        ExperimentConfig(grad_dct=29)
