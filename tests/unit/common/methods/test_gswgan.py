"""GS-WGAN's client side (its core, no Flower): the query answer, refusals, warm start, critic fakes, state."""

import json
import os

import numpy as np
import pytest
import torch

from client import state as client_state
from common.io.codec import PayloadError, decode_grads, encode_samples, quantize_samples
from common.messages import LedgerReply
from common.methods import ExperimentConfig
from common.methods.gswgan.client import answer_query
from common.methods.gswgan.critic import replay_buffer, select_critic_fakes, warm_start
from common.methods.gswgan.messages import GsAnswer, GsQuery, validate_query
from common.methods.gswgan.privacy import planned_event, unspent_answers_note
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.node_ledger import NODE_STATE_ENV, read_node_book
from common.privacy.sampling import VOID_SAMPLING_SEED
from protos import wire
from server.strategy import Incoming
from tests.helpers import federation, gs_query, make_strategy, one_step, tiny_cfg


@pytest.fixture
def cfg():
    return ExperimentConfig(
        num_clients=2, model="tiny", batch_size=8, n_critic=2, synthetic_samples_per_writer=24, noise_seed=5
    )


def test_answer_records_exactly_one_event(cfg):
    state = client_state.new_state(cfg, 1, critic_lr=cfg.lr_d)
    answer = answer_query(state, cfg, gs_query(cfg))
    assert not answer.refused
    assert decode_grads(answer.grad, answer.grad_encoding, batch_size=8).shape == (8, 1, 28, 28)
    assert state.ledger.queries == 1
    assert answer.noise_multiplier == pytest.approx(cfg.noise_multiplier / np.sqrt(8))
    assert state.ledger.history[-1].noise_multiplier == answer.noise_multiplier


def test_malformed_query_is_rejected_before_any_ledger_entry(cfg):
    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    q = gs_query(cfg)
    q.fake = q.fake[:-1]
    with pytest.raises(PayloadError):
        answer_query(state, cfg, q)
    assert state.ledger.queries == 0


def test_budget_refusal_spends_nothing(cfg):
    tight = cfg.replace(client_epsilon_budget=1.0)
    state = client_state.new_state(tight, 0, critic_lr=tight.lr_d)
    answer = answer_query(state, tight, gs_query(tight))
    assert answer.refused and "budget" in answer.reason and answer.grad is None
    assert state.ledger.queries == 0
    assert state.ledger.would_exceed(budget=1.0, delta=cfg.delta, next_event=planned_event(cfg, 8))


def test_state_survives_a_new_process_exactly(cfg, tmp_path):
    state = client_state.new_state(cfg, 1, critic_lr=cfg.lr_d)
    answer_query(state, cfg, gs_query(cfg, 0))
    client_state.save_state(state, tmp_path)
    client_state.clear_cache()  # as if the worker process were new
    loaded = client_state.load_state(cfg, 1, tmp_path, version=state.version, critic_lr=cfg.lr_d)
    assert loaded is not state and loaded.ledger.queries == 1 and loaded.version == state.version
    for a, b in zip(
        state.discriminator.state_dict().values(), loaded.discriminator.state_dict().values(), strict=False
    ):
        assert torch.equal(a, b)
    # Both continue identically (same data cursor, same seeded noise).
    a = answer_query(state, cfg, gs_query(cfg, 1))
    b = answer_query(loaded, cfg, gs_query(cfg, 1))
    np.testing.assert_array_equal(a.grad, b.grad)


def test_cache_is_used_only_at_the_matching_version(cfg, tmp_path):
    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    client_state.save_state(state, tmp_path)
    assert client_state.load_state(cfg, 0, tmp_path, version=state.version, critic_lr=cfg.lr_d) is state
    state.version += 1  # advanced elsewhere, file not rewritten: the cache entry is stale
    assert client_state.load_state(cfg, 0, tmp_path, version=99, critic_lr=cfg.lr_d) is not state


def test_corrupt_state_file_is_a_clear_error(cfg, tmp_path):
    client_state.clear_cache()
    client_state.state_path(tmp_path, 0).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="unreadable"):
        client_state.load_state(cfg, 0, tmp_path, version=1, critic_lr=cfg.lr_d)


def test_warm_start_trains_d_without_privacy_cost(cfg):
    warm = cfg.replace(warmup_steps=4)
    state = client_state.new_state(warm, 0, critic_lr=warm.lr_d)
    before = [p.detach().clone() for p in state.discriminator.parameters()]
    warm_start(state, warm)
    assert state.warmed_up and state.ledger.queries == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, state.discriminator.parameters(), strict=False))


def _grads(answer, B=8):
    return decode_grads(answer.grad, answer.grad_encoding, batch_size=B)


def test_float16_is_the_cast_of_the_noisy_float32_gradient_and_the_ledger_is_unchanged(cfg):
    """Same seeded noise: the float16 answer is exactly the float16 cast of the noisy float32 one."""
    out = {}
    for dtype in ("float32", "float16"):
        c = cfg.replace(wire_dtype=dtype)
        state = client_state.new_state(c, 1, critic_lr=c.lr_d)
        out[dtype] = (answer_query(state, c, gs_query(c)), state.ledger)
    (a32, led32), (a16, led16) = out["float32"], out["float16"]
    assert a32.grad_encoding.startswith("float32") and a16.grad_encoding.startswith("float16")
    g32, g16 = _grads(a32), _grads(a16)
    np.testing.assert_array_equal(g16, g32.astype(np.float16).astype(np.float32))
    assert not np.array_equal(g16, g32)
    assert np.abs(g32).max() > 0.5  # the noise (std 2σC) is in there, not only the clipped gradient
    assert led16.history == led32.history
    assert a16.noise_multiplier == a32.noise_multiplier


def test_client_trains_and_differentiates_at_the_dequantized_images(cfg):
    q = gs_query(cfg)
    levels, tag = encode_samples(q.fake, "uint8", compress=True)
    as_uint8 = GsQuery(step=0, batch_size=8, fake=levels, labels=q.labels, fake_encoding=tag)
    dequantized = GsQuery(step=0, batch_size=8, labels=q.labels, fake=quantize_samples(q.fake).astype(np.float32) / 255)
    a = answer_query(client_state.new_state(cfg, 1, critic_lr=cfg.lr_d), cfg, as_uint8)
    b = answer_query(client_state.new_state(cfg, 1, critic_lr=cfg.lr_d), cfg, dequantized)
    np.testing.assert_array_equal(_grads(a), _grads(b))


@pytest.mark.parametrize("mode", ["query", "replay"])
def test_reused_critic_fakes_need_one_batch_pergs_query(cfg, mode):
    reuse = cfg.replace(critic_fakes=mode, replay_batches=2)
    state = client_state.new_state(reuse, 0, critic_lr=reuse.lr_d)
    with pytest.raises(PayloadError, match="shape"):
        answer_query(state, reuse, gs_query(cfg))  # a query with fresh critic batches
    for step in range(3):
        assert not answer_query(state, reuse, gs_query(reuse, step)).refused
    assert state.ledger.queries == 3
    assert len(replay_buffer(state, 2)) == (2 if mode == "replay" else 0)


def test_replay_draws_from_the_buffer_and_the_queried_batch(cfg):
    reuse = cfg.replace(critic_fakes="replay", replay_batches=1, n_critic=4)
    state = client_state.new_state(reuse, 0, critic_lr=reuse.lr_d)
    ones, zeros, y = torch.ones(8, 1, 28, 28), torch.zeros(8, 1, 28, 28), torch.zeros(8, dtype=torch.long)
    first, _ = select_critic_fakes(state, reuse, ones, y, 8)
    assert first.shape == (32, 1, 28, 28) and torch.all(first == 1)  # empty buffer: the queried batch
    second, _ = select_critic_fakes(state, reuse, zeros, y, 8)
    means = second.flatten(1).mean(dim=1)
    assert set(means.tolist()) == {0.0, 1.0}  # buffered ones and queried zeros both used
    assert torch.all(replay_buffer(state, 1)[0][0] == 0)  # capacity 1: only the latest kept


def test_only_the_sanitized_gradient_leaves_a_client_unless_stats_are_asked_for(cfg):
    """Critic statistics come from private data without noise: they must not leave by default."""
    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    assert answer_query(state, cfg, gs_query(cfg)).stats == {}
    debug = cfg.replace(client_stats=True)
    stats = answer_query(client_state.new_state(debug, 0, critic_lr=debug.lr_d), debug, gs_query(debug)).stats
    assert {"wasserstein", "grad_norm_mean", "clip_fraction"} <= set(stats)


def test_releases_made_with_a_debugging_option_are_recorded_as_not_private(cfg):
    """A fixed noise seed makes the noise recomputable; un-noised statistics leave with the answer:
    the client's own ledger says so, and its ε is unbounded."""
    from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED

    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    answer_query(state, cfg, gs_query(cfg))
    assert state.ledger.void_reasons == (VOID_NOISE_SEED,) and state.ledger.epsilon(delta=cfg.delta) == np.inf
    stats_cfg = cfg.replace(noise_seed=-1, client_stats=True)
    stats_state = client_state.new_state(stats_cfg, 0, critic_lr=stats_cfg.lr_d)
    answer_query(stats_state, stats_cfg, gs_query(stats_cfg))
    assert stats_state.ledger.void_reasons == (VOID_CLIENT_STATS,)
    private = cfg.replace(noise_seed=-1)
    clean = client_state.new_state(private, 0, critic_lr=private.lr_d)
    answer_query(clean, private, gs_query(private))
    assert clean.ledger.void_reasons == () and np.isfinite(clean.ledger.epsilon(delta=cfg.delta))


def test_a_query_with_another_batch_size_is_refused(cfg):
    """B sets the noise multiplier σ/√B of the release: only the run's B is answered."""
    state = client_state.new_state(cfg, 0, critic_lr=cfg.lr_d)
    q = gs_query(cfg.replace(batch_size=16))
    answer = answer_query(state, cfg, q)
    assert answer.refused and "B = 16" in answer.reason and state.ledger.queries == 0


def test_the_nodes_budget_holds_whatever_the_server_asks(cfg):
    from common.privacy import NodePolicy

    private = cfg.replace(noise_seed=-1)  # the server asks for no budget at all
    state = client_state.new_state(private, 0, critic_lr=private.lr_d)
    policy = NodePolicy(max_epsilon=40.0)
    answers = [answer_query(state, private, gs_query(private, step), policy) for step in range(30)]
    assert any(a.refused for a in answers) and "budget 40" in next(a.reason for a in answers if a.refused)
    assert state.ledger.epsilon(delta=policy.delta) <= 40.0


def test_the_server_applies_the_clients_gradient_straight_through_the_quantization():
    """Clients differentiate at the dequantized uint8 images q(G(z)); the server applies what they
    send at G(z) itself, as if q were the identity (its true derivative is zero almost everywhere).
    G's gradient is exactly d/dθ <G(z), g> / divisor, Adam moves G, and the EMA (the release) follows."""
    from common.io.codec import dequantize_samples, quantize_samples
    from common.methods.gswgan.generator import ServerGenerator

    cfg = ExperimentConfig(model="tiny", batch_size=4, n_critic=1, ema_decay=0.5)
    server = ServerGenerator(cfg, num_classes=10)
    fakes, labels, attached = server.query_batches(4, 1)
    sent = dequantize_samples(quantize_samples(fakes[-4:].numpy()))
    assert 0 < abs(sent - attached.detach().numpy()).max() <= 0.5 / 255 + 1e-7  # quantized, not equal
    grad = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    params = list(server.model.parameters())
    expected = torch.autograd.grad((attached * grad).sum() / 8.0, params, retain_graph=True)
    before = [p.detach().clone() for p in params]
    server.apply([attached], [grad], divisor=8.0)
    for p, want in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, want)
    assert any(not torch.equal(a, p) for a, p in zip(before, params, strict=True))
    # The EMA's warm-up blends the first update at d = 1/10, the second at min(0.5, 2/11).
    for new, init, live in zip(server.ema.module.parameters(), before, params, strict=True):
        torch.testing.assert_close(new, 0.1 * init + 0.9 * live.detach())
    ema_before = [p.detach().clone() for p in server.ema.module.parameters()]
    _, _, attached = server.query_batches(4, 1)
    server.apply([attached], [grad], divisor=8.0)
    for old, new, live in zip(ema_before, server.ema.module.parameters(), params, strict=True):
        torch.testing.assert_close(new, (2 / 11) * old + (9 / 11) * live.detach())


# --- the server side (through the server's shell: replies as a transport hands them) ---------------
B, N_CRITIC = 4, 2  # the server side's tests: make_strategy's batch and critic steps


def gs_answer(step=0, client=0, grad=None, **kw):
    grad = np.ones((B, 1, 28, 28), np.float32) if grad is None else grad
    return wire.encode(GsAnswer(step=step, grad=grad, noise_multiplier=0.5, **kw))


def g_params(strategy):
    return [p.detach().clone() for p in strategy.side.generator.model.parameters()]


def test_gswgan_query_shape_and_uniform_labels(tmp_path):
    _, s = make_strategy("gswgan")
    (out,) = s.configure_step(0, [101])
    query = wire.decode(GsQuery, out.content)
    assert out.message_type == "train.gswgan" and out.node_id == 101
    assert query.fake_encoding == "uint8+deflate" and query.labels.dtype == np.uint8
    fakes, labels = validate_query(query, n_critic=N_CRITIC, num_classes=10)
    assert fakes.shape == ((N_CRITIC + 1) * B, 1, 28, 28) and query.batch_size == B
    assert labels.min() >= 0 and labels.max() < 10


@pytest.mark.parametrize("mode", ["query", "replay"])
def test_gswgan_reused_critic_fakes_send_only_the_queried_batch(tmp_path, mode):
    _, s = make_strategy("gswgan", critic_fakes=mode)
    (out,) = s.configure_step(0, [101])
    fakes, labels = validate_query(
        wire.decode(GsQuery, out.content), n_critic=N_CRITIC, num_classes=10, critic_fakes=mode
    )
    assert fakes.shape == (B, 1, 28, 28) and labels.shape == (B,)


def test_gswgan_sends_quantized_samples_and_keeps_the_unquantized_output_for_backprop(tmp_path):
    """Straight-through: the client sees q(G(z)); the server backpropagates at G(z) itself."""
    _, s = make_strategy("gswgan")
    (out,) = s.configure_step(0, [101])
    fakes, _ = validate_query(wire.decode(GsQuery, out.content), n_critic=N_CRITIC, num_classes=10)
    attached = s.side._attached[101]
    assert attached.requires_grad
    assert torch.abs(torch.from_numpy(fakes[-B:]) - attached.detach()).max() <= 0.5 / 255 + 1e-6
    assert not torch.equal(torch.from_numpy(fakes[-B:]), attached.detach())


def test_gswgan_valid_answer_moves_g_and_records_the_event(tmp_path):
    _, s = make_strategy("gswgan")
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
    _, s = make_strategy("gswgan")
    s.configure_step(0, [101])
    before = g_params(s)
    outcome = s.aggregate_step(0, [reply])
    assert not outcome.took_step and getattr(outcome, field) == [101] and outcome.notes
    assert all(torch.equal(a, b) for a, b in zip(before, s.side.generator.model.parameters(), strict=False))
    assert s.side.records.ledger_of(0).queries == charged
    assert s.privacy_report(final=True)["clients"][0]["queries"] == charged  # the final report lists every client


def test_a_live_privacy_report_lists_the_clients_with_a_record_not_the_whole_federation():
    """Each metrics line asked for every client's ε: O(K) per line, 0.5 s at K = 10^5 with a few
    hundred clients ever queried. The live report lists the clients with a record, the final one all."""
    _, s = make_strategy("gswgan", num_clients=100_000)
    for step in range(3):
        s.configure_step(step, [101])
        s.aggregate_step(step, [Incoming(101, gs_answer(step=step))])
    live = s.privacy_report()
    assert [c["client_id"] for c in live["clients"]] == [0] and live["clients"][0]["queries"] == 3
    final = s.privacy_report(final=True)
    assert len(final["clients"]) == 100_000 and final["epsilon_max"] == live["epsilon_max"] > 0
    assert s.privacy_report()["clients"] is live["clients"]  # no record changed: the entries are reused
    s.configure_step(3, [102])
    s.aggregate_step(3, [Incoming(102, gs_answer(step=3))])
    assert [c["client_id"] for c in s.privacy_report()["clients"]] == [0, 1]


def test_gswgan_reports_the_larger_of_the_clients_ledger_and_its_own_record(tmp_path):
    """A client whose state file was lost reports a smaller ledger; one that answered late a larger
    one: neither silently replaces the other."""
    _, s = make_strategy("gswgan")
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
    cfg, s = make_strategy("gswgan")
    assert s.select_nodes([101, 102, 103])[0] in (101, 102, 103)
    assert s.select_nodes([101, 103])[0] in (101, 103)
    history = s.side.server_ledger.history
    assert [(e.sample_rate, e.population, e.sampling) for e in history] == [(1 / 3, 3, "wor"), (1 / 2, 2, "wor")]
    assert history[0].noise_multiplier == pytest.approx(cfg.noise_multiplier / 2) and not history[0].void
    report = s.privacy_report(final=True)["epsilon_amplified"]
    assert report["epsilon"] == pytest.approx(s.side.server_ledger.epsilon(delta=cfg.delta)) and report["steps"] == 2


def test_gswgan_sampling_is_secret_unless_the_testing_flag_makes_it_reproducible_and_void(tmp_path):
    nodes = list(range(100, 150))
    picks = [[make_strategy("gswgan", num_clients=50)[1].select_nodes(nodes) for _ in range(8)] for _ in range(2)]
    assert picks[0] != picks[1]  # the same --seed, different clients
    seeded = [make_strategy("gswgan", num_clients=50, sampling_seed=9)[1] for _ in range(2)]
    picks = [[s.select_nodes(nodes) for _ in range(8)] for s in seeded]
    assert picks[0] == picks[1]
    amplified = seeded[0].privacy_report()["epsilon_amplified"]
    assert amplified["epsilon"] is None and VOID_SAMPLING_SEED in amplified["epsilon_reason"]
    assert seeded[0].privacy_report()["not_private"] == []  # the per-client headline still stands


def test_the_unspent_answers_note_offers_more_clients_per_step_only_where_that_keeps_the_noise():
    """K 27,500, m 8, T 200 at a target: one answer each, 1,600 asked; all of them are asked by 3,437
    steps of 8 or by 200 steps of 137 (ceil(200·137/K) is still 1); a full schedule says nothing."""
    cfg = tiny_cfg(num_clients=27_500, clients_per_step=8, steps=200, target_epsilon=1.0)
    note = unspent_answers_note(cfg)
    assert (
        "asks for 1,600 answers" in note
        and "--steps 3437 would" in note
        and "--clients-per-step 137 over these 200" in note
    )
    assert "17.1x" in note
    assert "as would --clients-per-step" not in unspent_answers_note(
        cfg.replace(num_clients=3, clients_per_step=1, steps=2)
    )
    assert unspent_answers_note(cfg.replace(clients_per_step=137)) == ""


# --- the client side (through the client's shell: real nodes in this process) ---------------------
def test_nodes_answer_a_step_together_each_charging_its_own_node_ledger(tmp_path):
    """Two nodes of one process answer one step (their critic phases stacked): each release is in
    its node's own ledger before the reply leaves; a node not asked released nothing."""
    cfg = tiny_cfg(tmp_path)
    transport, nodes = federation(cfg)
    strategy, outcome = one_step(cfg, transport, nodes, asked=[0, 1])
    assert outcome.took_step and not outcome.failed_nodes and not outcome.exhausted_nodes
    root = os.environ[NODE_STATE_ENV]
    books = [read_node_book(root, c) for c in range(3)]
    assert [b.ledger.queries for b in books] == [1, 1, 0] and books[0].by_method == {"gswgan": 1}
    assert books[0].ledger.history == strategy.side.records.ledger_of(0).history  # what the server charged
