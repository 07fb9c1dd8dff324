"""Strategy hooks on hand-built replies (no transport): what each strategy does with what it receives."""

import json

import numpy as np
import pytest
import torch

from common.messages import LedgerReply
from common.methods import ExperimentConfig
from common.methods.dpgan.messages import DpganReply
from common.methods.fedavg_gan.messages import FedAvgReply
from common.methods.gswgan.messages import GsAnswer, GsQuery, validate_query
from common.models import build_generator
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_RAW_DELTA
from common.privacy.sampling import VOID_SAMPLING_SEED
from protos import wire
from server.strategy import Incoming, build_strategy

B, N_CRITIC = 4, 2


def make(strategy: str, tmp_path, **changes):
    cfg = ExperimentConfig(
        **{
            **dict(
                strategy=strategy,
                num_clients=3,
                model="tiny",
                batch_size=B,
                n_critic=N_CRITIC,
                fedavg_clients_per_round=2,
            ),
            **changes,
        }
    )
    s = build_strategy(cfg, 10)
    s.bind_nodes({101: 0, 102: 1, 103: 2})
    return cfg, s


def gs_answer(step=0, client=0, grad=None, **kw):
    grad = np.ones((B, 1, 28, 28), np.float32) if grad is None else grad
    return wire.encode(GsAnswer(step=step, grad=grad, noise_multiplier=0.5, **kw))


def g_params(strategy):
    return [p.detach().clone() for p in strategy.side.generator.model.parameters()]


def test_gswgan_query_shape_and_uniform_labels(tmp_path):
    _, s = make("gswgan", tmp_path)
    (out,) = s.configure_step(0, [101])
    query = wire.decode(GsQuery, out.content)
    assert out.message_type == "train.gswgan" and out.node_id == 101
    assert query.fake_encoding == "uint8+deflate" and query.labels.dtype == np.uint8
    fakes, labels = validate_query(query, n_critic=N_CRITIC, num_classes=10)
    assert fakes.shape == ((N_CRITIC + 1) * B, 1, 28, 28) and query.batch_size == B
    assert labels.min() >= 0 and labels.max() < 10


@pytest.mark.parametrize("mode", ["query", "replay"])
def test_gswgan_reused_critic_fakes_send_only_the_queried_batch(tmp_path, mode):
    _, s = make("gswgan", tmp_path, critic_fakes=mode)
    (out,) = s.configure_step(0, [101])
    fakes, labels = validate_query(
        wire.decode(GsQuery, out.content), n_critic=N_CRITIC, num_classes=10, critic_fakes=mode
    )
    assert fakes.shape == (B, 1, 28, 28) and labels.shape == (B,)


def test_gswgan_sends_quantized_samples_and_keeps_the_unquantized_output_for_backprop(tmp_path):
    """Straight-through: the client sees q(G(z)); the server backpropagates at G(z) itself."""
    _, s = make("gswgan", tmp_path)
    (out,) = s.configure_step(0, [101])
    fakes, _ = validate_query(wire.decode(GsQuery, out.content), n_critic=N_CRITIC, num_classes=10)
    attached = s.side._attached[101]
    assert attached.requires_grad
    assert torch.abs(torch.from_numpy(fakes[-B:]) - attached.detach()).max() <= 0.5 / 255 + 1e-6
    assert not torch.equal(torch.from_numpy(fakes[-B:]), attached.detach())


def test_gswgan_valid_answer_moves_g_and_records_the_event(tmp_path):
    _, s = make("gswgan", tmp_path)
    s.configure_step(0, [101])
    before = g_params(s)
    outcome = s.aggregate_step(0, [Incoming(101, gs_answer())])
    assert outcome.took_step and s.side.steps_done == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, s.side.generator.model.parameters(), strict=False))
    # The smaller of the planned σ/√B (1.07/2) and what the client says it ran (0.5).
    assert s.side.records.ledger_of(0).history == (PrivacyEvent(noise_multiplier=0.5, sample_rate=1.0),)


@pytest.mark.parametrize(
    "reply, field, charged",
    [
        (Incoming(101, None, "timeout"), "failed_nodes", 1),
        (Incoming(101, gs_answer(grad=np.full((B, 1, 28, 28), np.nan, np.float32))), "failed_nodes", 1),
        (Incoming(101, gs_answer(step=7)), "failed_nodes", 1),
        (
            Incoming(101, wire.encode(GsAnswer(step=0, refused=True, reason="budget"))),
            "exhausted_nodes",
            0,
        ),
    ],
)
def test_gswgan_unusable_replies_leave_g_alone_and_stay_charged_unless_refused(tmp_path, reply, field, charged):
    """The query was charged when sent: a lost or malformed reply may have been answered (and charged)
    on the client, so the server's record keeps it; only an explicit refusal releases nothing."""
    _, s = make("gswgan", tmp_path)
    s.configure_step(0, [101])
    before = g_params(s)
    outcome = s.aggregate_step(0, [reply])
    assert not outcome.took_step and getattr(outcome, field) == [101] and outcome.notes
    assert all(torch.equal(a, b) for a, b in zip(before, s.side.generator.model.parameters(), strict=False))
    assert s.side.records.ledger_of(0).queries == charged
    assert s.privacy_report()["clients"][0]["queries"] == charged


def test_gswgan_reports_the_larger_of_the_clients_ledger_and_its_own_record(tmp_path):
    """A client whose state file was lost reports a smaller ledger; one that answered late a larger
    one: neither silently replaces the other."""
    _, s = make("gswgan", tmp_path)
    for step in range(3):
        s.configure_step(step, [101])
        s.aggregate_step(step, [Incoming(101, gs_answer(step=step))])
    lost = PrivacyLedger([PrivacyEvent(noise_multiplier=0.5)])
    reply = wire.encode(LedgerReply(ledger=json.dumps(lost.state_dict())))
    notes = s.absorb_ledgers([Incoming(101, reply)])
    assert s.privacy_report()["clients"][0]["queries"] == 3 and "the larger is reported" in notes[0]
    late = PrivacyLedger([PrivacyEvent(noise_multiplier=0.5, count=5)])
    s.absorb_ledgers([Incoming(101, wire.encode(LedgerReply(ledger=json.dumps(late.state_dict()))))])
    assert s.privacy_report()["clients"][0]["queries"] == 5


def test_gswgan_records_the_sampling_that_ran_per_step(tmp_path):
    """q_t = m/K_t over the clients still available, never m/K from the configuration."""
    cfg, s = make("gswgan", tmp_path)
    assert s.select_nodes([101, 102, 103])[0] in (101, 102, 103)
    assert s.select_nodes([101, 103])[0] in (101, 103)
    history = s.side.server_ledger.history
    assert [(e.sample_rate, e.population, e.sampling) for e in history] == [(1 / 3, 3, "wor"), (1 / 2, 2, "wor")]
    assert history[0].noise_multiplier == pytest.approx(cfg.noise_multiplier / 2) and not history[0].void
    report = s.privacy_report(final=True)["epsilon_amplified"]
    assert report["epsilon"] == pytest.approx(s.side.server_ledger.epsilon(delta=cfg.delta)) and report["steps"] == 2


def test_gswgan_sampling_is_secret_unless_the_testing_flag_makes_it_reproducible_and_void(tmp_path):
    nodes = list(range(100, 150))
    picks = [[make("gswgan", tmp_path, num_clients=50)[1].select_nodes(nodes) for _ in range(8)] for _ in range(2)]
    assert picks[0] != picks[1]  # the same --seed, different clients
    seeded = [make("gswgan", tmp_path, num_clients=50, sampling_seed=9)[1] for _ in range(2)]
    picks = [[s.select_nodes(nodes) for _ in range(8)] for s in seeded]
    assert picks[0] == picks[1]
    amplified = seeded[0].privacy_report()["epsilon_amplified"]
    assert amplified["epsilon"] is None and VOID_SAMPLING_SEED in amplified["epsilon_reason"]
    assert seeded[0].privacy_report()["not_private"] == []  # the per-client headline still stands


def test_fedavg_clips_and_divides_by_the_fixed_number_sampled(tmp_path):
    cfg, s = make("fedavg-gan", tmp_path, fedavg_noise_multiplier=0.0, fedavg_clip=0.1, noise_seed=0)
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


def _wrong_shape(delta):  # a Fed-Avg delta or a DPGAN generator: one entry cut short
    name = next(iter(delta))
    return {**delta, name: delta[name].flatten()[:-1]}


def _missing_entry(delta):
    return dict(list(delta.items())[1:])


def _integer_entries(delta):
    return {k: v.to(torch.int64) for k, v in delta.items()}


@pytest.mark.parametrize(
    ("forge", "cause"),
    [(_wrong_shape, "has shape"), (_missing_entry, "missing ["), (_integer_entries, "dtype torch.int64")],
)
def test_fedavg_drops_a_delta_that_does_not_fit_d_marks_its_sender_and_keeps_the_round(tmp_path, forge, cause):
    """Issue 23, item 14: one such delta once discarded the whole round (honest deltas too), never
    marked its sender and named a list index; with m = K the run stalled with 0 steps."""
    cfg, s = make("fedavg-gan", tmp_path, fedavg_noise_multiplier=0.0, fedavg_clip=0.1, noise_seed=0)
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
    _, s = make("fedavg-gan", tmp_path, num_clients=40, fedavg_clients_per_round=4)
    sizes = [len(s.select_nodes(list(range(40)))) for _ in range(300)]
    assert len(set(sizes)) > 3 and 3.5 < sum(sizes) / len(sizes) < 4.5


def test_dpgan_takes_the_curators_generator_and_ledger(tmp_path):
    cfg, s = make("dpgan", tmp_path)
    (out,) = s.configure_step(0, [101, 102, 103][:1])
    gen = build_generator("tiny")
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5)])
    reply = wire.encode(
        DpganReply(
            step=0,
            refused=False,
            reason="",
            noise_multiplier=1.0,
            sample_rate=0.1,
            n_d=5,
            discriminator_steps=5,
            ledger=json.dumps(ledger.state_dict()),
            stats={"g_loss": 0.5},
            generator=gen.state_dict(),
        )
    )
    outcome = s.aggregate_step(0, [Incoming(101, reply)])
    assert outcome.took_step
    for a, b in zip(gen.state_dict().values(), s.side.generator.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    report = s.privacy_report(final=True)
    # The reply's ledger covers every step so far: it replaces the charge made when the round was sent.
    assert report["clients"][0]["epsilon"] == pytest.approx(ledger.epsilon(delta=cfg.delta))
    assert report["parameters"]["discriminator_steps"] == 5
    assert s.select_nodes([102, 101, 103]) == [101]  # only the curator (client 0) is ever asked


def dpgan_reply(step, ledger):
    return wire.encode(
        DpganReply(
            step=step,
            refused=False,
            reason="",
            noise_multiplier=1.0,
            sample_rate=0.1,
            n_d=5,
            discriminator_steps=ledger.queries,
            ledger=json.dumps(ledger.state_dict()),
            stats={},
            generator=build_generator("tiny").state_dict(),
        )
    )


def test_dpgan_a_curator_ledger_that_goes_backwards_never_lowers_the_reported_epsilon(tmp_path):
    """Audit: deleting the curator's state file and resuming made the reported ε fall (1.743 ->
    1.661) while the released G depends on every DP step. The lost steps stay counted."""
    cfg, s = make("dpgan", tmp_path)
    step5 = PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5, sampling="poisson")
    notes = []
    for step, count in enumerate((5, 10, 5)):  # the third reply: a curator that lost its state
        s.configure_step(step, [101])
        notes += s.aggregate_step(step, [Incoming(101, dpgan_reply(step, PrivacyLedger([step5.times(count)])))]).notes
    all_steps = PrivacyLedger([step5.times(15)])
    reported = s.privacy_report(final=True)["clients"][0]["epsilon"]
    assert reported == pytest.approx(all_steps.epsilon(delta=cfg.delta))
    assert reported > PrivacyLedger([step5.times(10)]).epsilon(delta=cfg.delta)
    assert any("went backwards" in n for n in notes)
    # and it survives a checkpoint
    _, again = make("dpgan", tmp_path)
    again.load_state_dict(s.state_dict())
    assert again.privacy_report(final=True)["clients"][0]["epsilon"] == pytest.approx(reported)


def _g_all_nan(state):
    return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}


@pytest.mark.parametrize(
    ("forge", "cause"),
    [(_wrong_shape, "of shape"), (_missing_entry, "missing ["), (_g_all_nan, "NaN or infinite")],
)
def test_dpgan_refuses_a_generator_that_cannot_be_g_and_keeps_its_own(tmp_path, forge, cause):
    """Issue 23, item 15: a wrong-shape or missing tensor in the curator's G crashed the run (load_state_dict);
    an all-NaN G was taken, and its EMA released as completed."""
    cfg, s = make("dpgan", tmp_path)
    s.configure_step(0, [101])
    before = {k: v.clone() for k, v in s.released_generator().state_dict().items()}
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5)])
    reply = DpganReply(
        step=0,
        refused=False,
        reason="",
        noise_multiplier=1.0,
        sample_rate=0.1,
        n_d=5,
        discriminator_steps=5,
        ledger=json.dumps(ledger.state_dict()),
        generator=forge(build_generator("tiny").state_dict()),
    )
    outcome = s.aggregate_step(0, [Incoming(101, wire.encode(reply))])
    assert not outcome.took_step and outcome.failed_nodes == [101]
    (note,) = outcome.notes
    assert "malformed reply" in note and cause in note, note
    for k, v in s.released_generator().state_dict().items():
        assert torch.equal(v, before[k]), k
    assert s.side.records.ledger_of(0).queries == cfg.dpgan_n_d  # the round sent stays charged
