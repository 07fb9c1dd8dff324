"""Strategy hooks on hand-built replies (no transport): what each strategy does with what it receives."""

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from client.flower_wire import decode_query, encode_answer, encode_records
from common.codec import GsAnswer, validate_query
from common.config import ExperimentConfig
from common.models import build_generator
from common.privacy import PrivacyEvent, PrivacyLedger
from server.strategies import build_strategy
from server.strategies.base import Incoming

B, N_CRITIC = 4, 2


def make(strategy: str, tmp_path, **changes):
    cfg = ExperimentConfig(strategy=strategy, num_clients=3, model="tiny", batch_size=B, n_critic=N_CRITIC,
                           fedavg_clients_per_round=2, noise_seed=0, **changes)
    s = build_strategy(cfg, 10, str(tmp_path))
    s.bind_nodes({101: 0, 102: 1, 103: 2})
    return cfg, s


def gs_answer(step=0, client=0, grad=None, **kw):
    grad = np.ones((B, 1, 28, 28), np.float32) if grad is None else grad
    return encode_answer(GsAnswer(step=step, client_id=client, grad=grad, noise_multiplier=0.5,
                                  sample_rate=1.0, queries=1, epsilon=1.0, **kw))


def g_params(strategy):
    return [p.detach().clone() for p in strategy.generator.model.parameters()]


def test_gswgan_query_shape_and_uniform_labels(tmp_path):
    _, s = make("gswgan", tmp_path)
    (out,) = s.configure_step(0, [101])
    query, _ = decode_query(out.content)
    assert out.message_type == "train.gswgan" and out.node_id == 101
    assert query.fake_encoding == "uint8+deflate" and query.labels.dtype == np.uint8
    fakes, labels = validate_query(query, n_critic=N_CRITIC, num_classes=10)
    assert fakes.shape == ((N_CRITIC + 1) * B, 1, 28, 28) and query.batch_size == B
    assert labels.min() >= 0 and labels.max() < 10


@pytest.mark.parametrize("mode", ["query", "replay"])
def test_gswgan_reused_critic_fakes_send_only_the_queried_batch(tmp_path, mode):
    _, s = make("gswgan", tmp_path, critic_fakes=mode)
    (out,) = s.configure_step(0, [101])
    fakes, labels = validate_query(decode_query(out.content)[0], n_critic=N_CRITIC, num_classes=10,
                                   critic_fakes=mode)
    assert fakes.shape == (B, 1, 28, 28) and labels.shape == (B,)


def test_gswgan_sends_quantized_samples_and_keeps_the_unquantized_output_for_backprop(tmp_path):
    """Straight-through: the client sees q(G(z)); the server backpropagates at G(z) itself."""
    _, s = make("gswgan", tmp_path)
    (out,) = s.configure_step(0, [101])
    fakes, _ = validate_query(decode_query(out.content)[0], n_critic=N_CRITIC, num_classes=10)
    attached = s._attached[101]
    assert attached.requires_grad
    assert torch.abs(torch.from_numpy(fakes[-B:]) - attached.detach()).max() <= 0.5 / 255 + 1e-6
    assert not torch.equal(torch.from_numpy(fakes[-B:]), attached.detach())


def test_gswgan_valid_answer_moves_g_and_records_the_event(tmp_path):
    _, s = make("gswgan", tmp_path)
    s.configure_step(0, [101])
    before = g_params(s)
    outcome = s.aggregate_step(0, [Incoming(101, gs_answer())])
    assert outcome.took_step and s.steps_done == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, s.generator.model.parameters()))
    assert s.ledgers[0].history == PrivacyLedger([PrivacyEvent(noise_multiplier=0.5, sample_rate=1.0)]).history


@pytest.mark.parametrize("reply, field", [
    (Incoming(101, None, "timeout"), "failed_nodes"),
    (Incoming(101, gs_answer(grad=np.full((B, 1, 28, 28), np.nan, np.float32))), "failed_nodes"),
    (Incoming(101, gs_answer(step=7)), "failed_nodes"),
    (Incoming(101, encode_answer(GsAnswer(step=0, client_id=0, refused=True, reason="budget"))), "exhausted_nodes"),
])
def test_gswgan_unusable_replies_leave_g_and_ledgers_alone(tmp_path, reply, field):
    _, s = make("gswgan", tmp_path)
    s.configure_step(0, [101])
    before = g_params(s)
    outcome = s.aggregate_step(0, [reply])
    assert not outcome.took_step and getattr(outcome, field) == [101] and outcome.notes
    assert all(torch.equal(a, b) for a, b in zip(before, s.generator.model.parameters()))
    assert s.ledgers.get(0, PrivacyLedger()).queries == 0


def test_fedavg_clips_and_divides_by_the_fixed_number_sampled(tmp_path):
    cfg, s = make("fedavg-gan", tmp_path, fedavg_noise_multiplier=0.0, fedavg_clip=0.1)
    outs = s.configure_step(0, [101, 102])
    assert {"generator", "discriminator"} <= set(outs[0].content.array_records)
    d0 = {k: v.clone() for k, v in s.discriminator.state_dict().items()}
    big = {k: torch.full_like(v, 10.0) for k, v in d0.items() if v.is_floating_point()}
    reply = encode_records({}, {"client_id": 0, "step": 0})
    reply["delta"] = ArrayRecord(big)
    outcome = s.aggregate_step(0, [Incoming(101, reply), Incoming(102, None, "gone")])
    assert outcome.took_step and outcome.failed_nodes == [102]
    moved = torch.cat([(s.discriminator.state_dict()[k] - d0[k]).flatten() for k in big])
    # one clipped delta (norm S=0.1) divided by m=2 sampled, not by the 1 that replied
    assert moved.norm().item() == pytest.approx(0.1 / 2, rel=1e-4)
    report = s.privacy_report(final=True)
    assert all(c["epsilon"] is None and "unbounded" in c["epsilon_reason"] for c in report["clients"])


def test_dpgan_takes_the_curators_generator_and_ledger(tmp_path):
    cfg, s = make("dpgan", tmp_path)
    (out,) = s.configure_step(0, [101, 102, 103][:1])
    gen = build_generator("tiny")
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5)])
    reply = encode_records({}, {"client_id": 0, "step": 0, "refused": False, "reason": "",
                                "noise_multiplier": 1.0, "sample_rate": 0.1, "new_steps": 5, "n_d": 5,
                                "discriminator_steps": 5, "ledger": json.dumps(ledger.state_dict())})
    reply["generator"] = ArrayRecord(gen.state_dict())
    outcome = s.aggregate_step(0, [Incoming(101, reply)])
    assert outcome.took_step
    for a, b in zip(gen.state_dict().values(), s.generator.state_dict().values()):
        assert torch.equal(a, b)
    report = s.privacy_report(final=True)
    assert report["clients"][0]["epsilon"] == pytest.approx(ledger.epsilon(delta=cfg.delta))
    assert report["summary_extra"]["discriminator_steps"] == 5
    assert s.select_nodes([102, 101, 103]) == [101]  # only the curator (client 0) is ever asked
