"""Fed-Avg GAN's core: a client's local steps (its raw delta) and the server's generator steps.
Tiny models, seeded; exact counters, no loss values."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from common.learning.models import build_discriminator, build_generator
from common.methods.fedavg_gan.client import client_update
from common.methods.fedavg_gan.dp_fedavg import apply_delta, delta_norm
from common.methods.fedavg_gan.messages import FedAvgReply
from common.methods.fedavg_gan.server import server_generator_steps
from common.privacy.events import VOID_RAW_DELTA
from common.privacy.node_ledger import NODE_STATE_ENV, read_node_book
from protos import wire
from server.strategy import Incoming
from tests.helpers import cut_short, drop_first, federation, make_strategy, one_step, tiny_cfg

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


# --- the server side (through the server's shell: replies as a transport hands them) ---------------
def test_fedavg_clips_and_divides_by_the_fixed_number_sampled(tmp_path):
    cfg, s = make_strategy("fedavg-gan", fedavg_noise_multiplier=0.0, fedavg_clip=0.1, noise_seed=0)
    outs = s.configure_step(0, [101, 102])
    assert {"generator", "discriminator"} <= set(outs[0].content.array_records)
    d0 = {k: v.clone() for k, v in s.side.discriminator.state_dict().items()}
    big = {k: torch.full_like(v, 10.0) for k, v in d0.items() if v.is_floating_point()}
    reply = wire.encode(FedAvgReply(step=0, delta=big))
    outcome = s.aggregate_step(0, [Incoming(101, reply), Incoming(102, None, "gone")])
    assert outcome.took_step and outcome.failed_nodes == [102]
    moved = torch.cat([(s.side.discriminator.state_dict()[k] - d0[k]).flatten() for k in big])
    # one clipped delta (norm S=0.1) divided by m=2 sampled, not by the 1 that replied
    assert moved.norm().item() == pytest.approx(0.1 / 2, rel=1e-4)
    report = s.privacy_report(final=True)
    sent, never = report["clients"][:2], report["clients"][2]
    assert all(c["epsilon"] is None and VOID_RAW_DELTA in c["epsilon_reason"] for c in sent)
    assert (never["queries"], never["epsilon"]) == (0, 0.0)  # a client that sent nothing released nothing
    (event,) = s.side.server_ledger.history
    assert (event.sampling, event.sample_rate, event.noise_multiplier) == ("poisson", 2 / 3, 0.0)


def _integer_entries(delta):
    return {k: v.to(torch.int64) for k, v in delta.items()}


@pytest.mark.parametrize(
    ("forge", "cause"),
    [(cut_short, "has shape"), (drop_first, "missing ["), (_integer_entries, "dtype torch.int64")],
)
def test_fedavg_drops_a_delta_that_does_not_fit_d_marks_its_sender_and_keeps_the_round(tmp_path, forge, cause):
    """Issue 23, item 14: one such delta once discarded the whole round (honest deltas too), never
    marked its sender and named a list index; with m = K the run stalled with 0 steps."""
    cfg, s = make_strategy("fedavg-gan", fedavg_noise_multiplier=0.0, fedavg_clip=0.1, noise_seed=0)
    s.configure_step(0, [101, 102])
    d0 = {k: v.clone() for k, v in s.side.discriminator.state_dict().items()}
    big = {k: torch.full_like(v, 10.0) for k, v in d0.items() if v.is_floating_point()}
    replies = [Incoming(101, wire.encode(FedAvgReply(step=0, delta=big)))]
    replies.append(Incoming(102, wire.encode(FedAvgReply(step=0, delta=forge(big)))))
    outcome = s.aggregate_step(0, replies)
    assert outcome.took_step and outcome.failed_nodes == [102]
    (note,) = outcome.notes
    assert "node 102 (client 1) sent a malformed delta" in note and cause in note, note
    moved = torch.cat([(s.side.discriminator.state_dict()[k] - d0[k]).flatten() for k in big])
    assert moved.norm().item() == pytest.approx(0.1 / 2, rel=1e-4)  # the honest delta alone, over m = 2
    assert len(s.side.server_ledger.history) == 1  # the round released a noised D: it is accounted


def test_fedavg_samples_each_client_independently(tmp_path):
    """DP-FedAvg's Poisson sampling, as its accounting assumes: any number of clients per round."""
    _, s = make_strategy("fedavg-gan", num_clients=40, fedavg_clients_per_round=4)
    sizes = [len(s.select_nodes(list(range(40)))) for _ in range(300)]
    assert len(set(sizes)) > 3 and 3.5 < sum(sizes) / len(sizes) < 4.5


# --- the client side (through the client's shell: real nodes in this process) ---------------------
def test_a_nodes_raw_delta_is_charged_as_a_release_without_noise(tmp_path, trust_server):
    cfg = tiny_cfg(tmp_path, strategy="fedavg-gan")
    transport, nodes = federation(cfg)
    strategy, outcome = one_step(cfg, transport, nodes, asked=[0, 1])
    assert outcome.took_step and not outcome.failed_nodes
    book = read_node_book(os.environ[NODE_STATE_ENV], 0)
    assert book.by_method == {"fedavg-gan": 1} and book.ledger.history[0].void == VOID_RAW_DELTA
    assert read_node_book(os.environ[NODE_STATE_ENV], 2).ledger.queries == 0
