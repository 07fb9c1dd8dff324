"""Fed-Avg GAN's free levers (issue 25: make it learn without noise): a weights-only delta with the
server's own power iteration, the clients' Adam, the server's Adam on G. Each is used when asked
for, the defaults stay the paper's, and none changes the mechanism on the delta or the ledger of a
given config. Tiny models, seeded; exact counters, no loss values."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.learning.models import build_discriminator, build_generator
from common.methods import ExperimentConfig
from common.methods.fedavg_gan.client import client_update, local_optimizer
from common.methods.fedavg_gan.dp_fedavg import refresh_power_iteration
from common.methods.fedavg_gan.messages import FedAvgReply
from common.methods.fedavg_gan.privacy import calibrate
from common.options import ConfigError
from protos import wire
from server.strategy import Incoming
from tests.helpers import make_strategy

Z_DIM, NUM_CLASSES = 10, 10
LEVERS = dict(fedavg_delta="weights", fedavg_client_optimizer="adam", fedavg_g_optimizer="adam", fedavg_lr_g=1e-3)


def _states(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _client(G: nn.Module, D: nn.Module, **levers: object) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand(24, 1, 28, 28, generator=g), torch.randint(0, NUM_CLASSES, (24,), generator=g)
    return client_update(
        _states(G), _states(D), preset="tiny", num_classes=NUM_CLASSES, z_dim=Z_DIM, real_images=images,
        real_labels=labels, local_steps=3, batch_size=8, generator=torch.Generator().manual_seed(1), **levers,
    )  # fmt: skip


def _power_vectors(D: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in D.state_dict().items() if k.endswith(("_u", "_v"))}


# --- the client -------------------------------------------------------------------------------------
def test_a_weights_only_delta_holds_exactly_ds_parameters() -> None:
    torch.manual_seed(0)
    G, D = build_generator("tiny", z_dim=Z_DIM), build_discriminator("tiny")
    delta = _client(G, D, scope="weights")
    assert set(delta) == {name for name, _ in D.named_parameters()}
    assert not any(k.endswith(("_u", "_v")) for k in delta) and any(v.abs().sum() > 0 for v in delta.values())
    whole = _client(G, D)  # the default covers the state: the same weights' entries, plus the vectors
    assert set(whole) > set(delta) and all(torch.equal(whole[k], delta[k]) for k in delta)


def test_the_clients_optimizer_is_the_one_asked_for() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    assert type(local_optimizer(params, "sgd", lr=0.1, betas=(0.5, 0.9))) is torch.optim.SGD
    adam = local_optimizer(params, "adam", lr=0.1, betas=(0.5, 0.9))
    assert type(adam) is torch.optim.Adam and adam.param_groups[0]["betas"] == (0.5, 0.9)
    with pytest.raises(ValueError, match="unknown client optimizer"):
        local_optimizer(params, "lion", lr=0.1, betas=(0.5, 0.9))
    torch.manual_seed(0)
    G, D = build_generator("tiny", z_dim=Z_DIM), build_discriminator("tiny")
    sgd, adam_delta = _client(G, D, scope="weights"), _client(G, D, scope="weights", optimizer="adam")
    assert any(not torch.equal(sgd[k], adam_delta[k]) for k in sgd)


def test_refresh_power_iteration_moves_the_vectors_only_and_keeps_the_mode() -> None:
    torch.manual_seed(0)
    D = build_discriminator("tiny").eval()
    weights, vectors = dict(D.named_parameters()), _power_vectors(D)
    weights = {k: v.detach().clone() for k, v in weights.items()}
    refresh_power_iteration(D, iterations=3)
    assert not D.training
    assert all(torch.equal(p, weights[k]) for k, p in D.named_parameters())
    moved = [k for k, v in _power_vectors(D).items() if v.numel() > 1 and not torch.equal(v, vectors[k])]
    assert len(moved) >= 4
    before = _power_vectors(D)
    refresh_power_iteration(D, iterations=0)
    assert all(torch.equal(v, before[k]) for k, v in _power_vectors(D).items())


# --- the server -------------------------------------------------------------------------------------
def _round(s, delta: dict[str, torch.Tensor]):
    s.configure_step(0, [101, 102])
    return s.aggregate_step(
        0, [Incoming(101, wire.encode(FedAvgReply(step=0, delta=delta))), Incoming(102, None, "gone")]
    )


def test_a_weights_only_round_clips_the_weights_and_refreshes_the_vectors() -> None:
    _, s = make_strategy(
        "fedavg-gan", fedavg_noise_multiplier=0.0, fedavg_clip=0.1, noise_seed=0, fedavg_delta="weights"
    )
    D = s.side.discriminator
    names = {name for name, _ in D.named_parameters()}
    assert set(s.side.expectations(0)["shapes"]) == names
    d0, vectors = _states(D), _power_vectors(D)
    big = {k: torch.full_like(v, 10.0) for k, v in d0.items() if k in names}
    outcome = _round(s, big)
    assert outcome.took_step and outcome.failed_nodes == [102]
    moved = torch.cat([(D.state_dict()[k] - d0[k]).flatten() for k in big])
    assert moved.norm().item() == pytest.approx(0.1 / 2, rel=1e-4)  # clipped to S, over the fixed m = 2
    assert any(not torch.equal(v, vectors[k]) for k, v in _power_vectors(D).items() if v.numel() > 1)


def test_a_whole_state_delta_does_not_fit_a_weights_only_round() -> None:
    _, s = make_strategy("fedavg-gan", fedavg_noise_multiplier=0.0, noise_seed=0, fedavg_delta="weights")
    whole = {k: torch.zeros_like(v) for k, v in s.side.discriminator.state_dict().items() if v.is_floating_point()}
    s.configure_step(0, [101, 102])
    outcome = s.aggregate_step(0, [Incoming(101, wire.encode(FedAvgReply(step=0, delta=whole)))])
    assert outcome.failed_nodes == [101] and "unexpected" in outcome.notes[0]


@pytest.mark.parametrize(("name", "kind"), [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)])
def test_the_servers_generator_optimizer_is_used_and_checkpointed(name, kind) -> None:
    _, s = make_strategy(
        "fedavg-gan", fedavg_noise_multiplier=0.0, noise_seed=0, server_g_steps=3, fedavg_g_optimizer=name
    )
    opt = s.side.g_optimizer
    assert type(opt) is kind and opt.param_groups[0]["params"] == list(s.side.generator.parameters())
    D = s.side.discriminator
    _round(s, {k: torch.zeros_like(v) for k, v in D.state_dict().items() if v.is_floating_point()})
    if name == "adam":  # its moments live across rounds: one step per generator step so far
        assert {int(st["step"]) for st in opt.state_dict()["state"].values()} == {3}
    _, again = make_strategy("fedavg-gan", server_g_steps=3, fedavg_g_optimizer=name)
    again.side.load_state_dict(s.side.state_dict())
    assert again.side.g_optimizer.state_dict()["state"].keys() == opt.state_dict()["state"].keys()


def test_the_levers_leave_the_ledger_and_the_calibration_of_a_config_unchanged() -> None:
    """The accounting sees z, q and the rounds only: the same config with and without the levers
    records the same events and calibrates the same z."""
    events = []
    for levers in ({}, LEVERS):
        _, s = make_strategy("fedavg-gan", fedavg_noise_multiplier=0.7, **levers)
        D = s.side.discriminator
        template = {k: torch.zeros_like(v) for k, v in s.side._template().items()}
        assert set(template) <= {k for k, v in D.state_dict().items() if v.is_floating_point()}
        _round(s, template)
        events.append(s.side.server_ledger.history)
        assert s.side.mechanism() == {"S": 0.1, "z": 0.7, "expected m per round": 2, "q": 2 / 3}
    assert events[0] == events[1] and len(events[0]) == 1
    base = ExperimentConfig(strategy="fedavg-gan", num_clients=100, steps=150, target_epsilon=10.0)
    assert calibrate(base).fedavg_noise_multiplier == calibrate(base.replace(**LEVERS)).fedavg_noise_multiplier


@pytest.mark.parametrize(
    "bad", [{"fedavg_delta": "buffers"}, {"fedavg_client_optimizer": "lion"}, {"fedavg_g_optimizer": "rmsprop"}]
)
def test_an_unknown_lever_value_is_refused(bad) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        make_strategy("fedavg-gan", **bad)
