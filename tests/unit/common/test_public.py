"""Public data (dpGAN's warm start): what is declared public is in no client's partition, and
training on it costs no privacy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.config import ConfigError
from common.data import clear_cache, client_arrays, partition_sizes
from common.data.clients import training_set
from common.data.public import held_out, public_arrays
from common.data.synthetic import synthetic_writer
from common.methods import ExperimentConfig


def _snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    """Whether any parameter of ``module`` differs from its copy in ``before``."""
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def test_a_holdout_is_removed_from_every_partition_before_the_split():
    cfg = ExperimentConfig(num_clients=4, partition="iid", synthetic_writers=6, public_data="holdout", public_size=100)
    n = len(training_set(cfg))
    public = set(held_out(cfg, n).tolist())
    assert len(public) == 100 and sum(partition_sizes(cfg)) == n - 100
    images, labels = public_arrays(cfg)
    dataset = training_set(cfg)
    np.testing.assert_array_equal(images, dataset.images[sorted(public)])
    private = np.concatenate([client_arrays(cfg, k)[0] for k in range(4)])
    # no public image is any client's (compared as rows: the synthetic images are all distinct)
    rows = {img.tobytes() for img in private}
    assert not any(img.tobytes() in rows for img in images)


def test_a_writer_holdout_is_writers_outside_the_federation():
    cfg = ExperimentConfig(num_clients=3, public_data="holdout", public_size=150, synthetic_samples_per_writer=120)
    images, labels = public_arrays(cfg)
    assert images.shape == (150, 28, 28)
    first, _ = synthetic_writer(3, 120, seed=cfg.seed)  # writer 3: the first after clients 0, 1, 2
    np.testing.assert_array_equal(images[:120], first)
    assert partition_sizes(cfg) == [120, 120, 120]  # the clients keep their whole writers


def test_public_synthetic_data_shares_no_writer_with_a_synthetic_federation():
    cfg = ExperimentConfig(num_clients=3, public_data="synthetic", public_size=50)
    images, _ = public_arrays(cfg)
    private = {img.tobytes() for k in range(3) for img in client_arrays(cfg, k)[0]}
    assert images.shape == (50, 28, 28) and not any(img.tobytes() in private for img in images)


def test_the_public_options_are_checked_at_the_boundary():
    with pytest.raises(ConfigError, match="public_warmup_steps"):
        ExperimentConfig(public_warmup_steps=5)
    with pytest.raises(ConfigError, match="public_data"):
        ExperimentConfig(public_data="internet")


def test_gswgan_public_warm_start_moves_g_and_charges_nobody():
    from common.methods.gswgan.generator import ServerGenerator

    cfg = ExperimentConfig(model="tiny", num_clients=3, public_data="synthetic", public_size=64, public_warmup_steps=2)
    server = ServerGenerator(cfg, 10)
    before = _snapshot(server.model)
    assert not server.public_warmed
    server.public_warm_start()
    assert server.public_warmed and server.ema.num_updates == 0
    assert _moved(before, server.model)
    for a, b in zip(server.model.state_dict().values(), server.ema.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the EMA restarts from the warmed G


def test_gswgan_clients_warm_start_on_public_data_first_at_no_cost():
    from client import state as client_state
    from common.methods.gswgan.critic import first_contact

    cfg = ExperimentConfig(
        model="tiny", num_clients=2, batch_size=8, public_data="synthetic", public_size=32, public_warmup_steps=3
    )
    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    before = _snapshot(state.discriminator)
    first_contact(state, cfg)
    assert state.warmed_up and state.ledger.queries == 0
    assert _moved(before, state.discriminator)


def test_dpgan_public_warm_start_adds_no_dp_step():
    from common.methods.dpgan.curator import new_node, run_round

    cfg = ExperimentConfig(
        strategy="dpgan",
        model="tiny",
        num_clients=2,
        dpgan_n_d=2,
        public_data="holdout",
        public_size=40,
        public_warmup_steps=2,
    )
    node = new_node(cfg)
    before = _snapshot(node.generator)
    run_round(node, cfg)
    assert node.public_warmed and node.ledger.queries == 2  # the round's n_D steps, nothing for the warm start
    assert _moved(before, node.generator)


def test_fedavg_public_warm_start_moves_g_and_the_first_global_d():
    from common.methods.fedavg_gan.server import FedAvgServer

    cfg = ExperimentConfig(
        strategy="fedavg-gan",
        model="tiny",
        num_clients=3,
        fedavg_clients_per_round=2,
        public_data="synthetic",
        public_size=64,
        public_warmup_steps=2,
    )
    strategy = FedAvgServer(cfg, 10)
    g_before = _snapshot(strategy.generator)
    d_before = _snapshot(strategy.discriminator)
    strategy.requests(0, [])
    assert strategy.public_warmed and strategy.ema.num_updates == 0
    assert _moved(g_before, strategy.generator)
    assert _moved(d_before, strategy.discriminator)
    assert strategy.state_dict()["public_warmed"] is True
