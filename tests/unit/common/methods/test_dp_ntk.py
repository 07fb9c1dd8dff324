"""DP-NTK: the tangent features (their norm, their closed-form class means, their size), the seam
through which DP-MERF's release uses them, and one-shot releases counted across the two methods."""

import math
import os

import pytest
import torch

from common.config import ConfigError
from common.methods import ExperimentConfig, method
from common.methods.dp_merf.features import class_means, embed
from common.methods.dp_ntk.features import TangentFeatures
from common.privacy.node_ledger import NODE_STATE_ENV, read_node_book
from tests.helpers import federation, one_step, secure_plan


def cfg(**changes) -> ExperimentConfig:
    base = dict(
        strategy="dp-ntk", num_clients=3, model="tiny", ntk_width=12, ntk_dct=6, synthetic_samples_per_writer=20,
        eval=False, progress=False,
    )  # fmt: skip
    return ExperimentConfig(**{**base, **changes})


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dct", [0, 6])
def test_tangent_rows_have_unit_norm_and_the_analytic_gradient(dct):
    c = cfg(ntk_dct=dct, merf_count_share=0.2)
    f = TangentFeatures(c)
    x = images(5)
    phi = f(x)
    d = dct * dct if dct else 784
    assert phi.shape == (5, 12 * (d + 1) + 1) == (5, f.dim)
    assert torch.allclose(phi.norm(dim=1), torch.ones(5), atol=1e-5)
    assert torch.allclose(phi[:, -1], torch.full((5,), math.sqrt(0.2)))
    # The rows are the network's gradient at initialisation, normalised: autograd agrees.
    u = x.reshape(5, -1) if not dct else f.parts(x)[0]
    w = f.weight.clone().requires_grad_(True)
    v = f.sign.clone().requires_grad_(True)
    out = (torch.relu(u[0] @ w.T) * v).sum() / math.sqrt(12)
    gv, gw = torch.autograd.grad(out, (v, w))
    grad = torch.cat([gv, gw.flatten()])
    assert torch.allclose(phi[0, :-1], grad / grad.norm() * math.sqrt(0.8), atol=1e-5)


def test_class_means_in_closed_form_equal_the_mean_of_the_rows():
    f = TangentFeatures(cfg())
    x, y = images(40), torch.arange(40) % 10
    assert torch.allclose(f.class_means(x, y, 10, total=40), class_means(f(x), y, 10, total=40), atol=1e-6)
    summary = embed(f, x, y, 10, chunk=7)
    assert summary.norm() <= 1 / math.sqrt(10) + 1e-5  # balanced: the one-shot release's bound holds


def test_the_map_is_public_and_seeded():
    a, b = TangentFeatures(cfg()), TangentFeatures(cfg())
    assert torch.equal(a.weight, b.weight) and torch.equal(a.sign, b.sign)
    assert not torch.equal(a.weight, TangentFeatures(cfg(seed=1)).weight)


def test_the_secure_plan_takes_the_family_size():
    c = cfg(ntk_width=5, ntk_dct=4, secure_aggregation=True, merf_noise_multiplier=1.0, secagg_cohort=3)
    assert secure_plan(c).dim == 10 * (5 * 17 + 1)


def test_options_are_checked_by_name():
    with pytest.raises(ConfigError, match="ntk_width"):
        cfg(ntk_width=0)
    with pytest.raises(ConfigError, match="ntk_dct"):
        cfg(ntk_dct=29)
    with pytest.raises(ConfigError, match="ntk_width=100000"):
        cfg(ntk_width=100_000, ntk_dct=0)


def test_calibration_is_the_one_shot_release():
    c = method("dp-ntk").calibrate(cfg(target_epsilon=10.0), pooled_size=None)
    d = method("dp-merf").calibrate(cfg(strategy="dp-merf", target_epsilon=10.0), pooled_size=None)
    assert c.merf_noise_multiplier == pytest.approx(d.merf_noise_multiplier)  # one Gaussian release each


def test_a_node_that_released_for_dp_merf_refuses_dp_ntk(tmp_path):
    merf = cfg(strategy="dp-merf", out=str(tmp_path / "merf"), merf_features=20)
    transport, nodes = federation(merf)
    _, outcome = one_step(merf, transport, nodes, asked=[0])
    assert outcome.took_step
    ntk = cfg(out=str(tmp_path / "ntk"))
    transport, nodes = federation(ntk)
    _, outcome = one_step(ntk, transport, nodes, asked=[0, 1])
    root = os.environ[NODE_STATE_ENV]
    assert outcome.exhausted_nodes == [nodes[0]] and "another one-shot method's" in outcome.notes[0]
    assert read_node_book(root, 1).by_method == {"dp-ntk": 1}
    assert read_node_book(root, 0).by_method == {"dp-merf": 1}


def test_a_round_of_the_collection_holds_a_bounded_number_of_bytes():
    from common.methods.dp_merf.server import COLLECT_BYTES, COLLECT_CHUNK, collect_chunk

    assert collect_chunk((10, 401)) == COLLECT_CHUNK  # DP-MERF's 16 kB summaries: the full round
    big = (10, 200 * 785 + 1)  # DP-NTK's default: 6.3 MB each
    assert 1 <= collect_chunk(big) <= COLLECT_BYTES // (4 * big[0] * big[1]) < COLLECT_CHUNK
    assert collect_chunk((10, 10**9)) == 1  # never zero
