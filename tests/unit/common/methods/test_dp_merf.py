"""DP-MERF's core: the public feature map, the summary's norm, the one release and its ledger entry,
the calibration, the validation of a release, and the server's fit."""

import math
import os

import numpy as np
import pytest
import torch

from common.calibration import ledger_epsilon
from common.client_state import new_state
from common.config import ConfigError
from common.io.codec import PayloadError
from common.methods import ExperimentConfig
from common.methods.dp_merf.client import clip_summary, release
from common.methods.dp_merf.features import RANDOM_FOURIER, FeatureMap, class_means, embed
from common.methods.dp_merf.generator import MerfGenerator, roughness
from common.methods.dp_merf.messages import MerfRelease, MerfRequest
from common.methods.dp_merf.privacy import calibrate, cohort_noise_note, honest_norm_bound
from common.privacy import NodePolicy, PrivacyLedger
from common.privacy.node_ledger import NODE_STATE_ENV, read_node_book
from tests.helpers import federation, one_step


def cfg(**changes) -> ExperimentConfig:
    base = dict(
        strategy="dp-merf", num_clients=4, model="tiny", merf_features=50, synthetic_samples_per_writer=40, eval=False
    )
    return ExperimentConfig(**{**base, **changes})


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dct", [0, 10])
def test_features_have_unit_norm_and_are_public(dct):
    c = cfg(merf_dct=dct, merf_count_share=0.2)
    phi = FeatureMap(c)(images(64))
    assert phi.shape == (64, 2 * 50 + 1)
    assert torch.allclose(phi.norm(dim=1), torch.ones(64), atol=1e-5)
    assert torch.allclose(phi[:, -1], torch.full((64,), math.sqrt(0.2)))
    # Everyone who knows the configuration builds the same map; another seed, another map.
    assert torch.equal(FeatureMap(c).frequencies, FeatureMap(c).frequencies)
    assert not torch.equal(FeatureMap(c).frequencies, FeatureMap(c.replace(seed=1)).frequencies)


def test_summary_norm_is_bounded_whatever_the_data():
    c = cfg()
    fmap = FeatureMap(c)
    one_class = embed(fmap, images(30), torch.zeros(30, dtype=torch.long), 10)
    assert one_class.norm() <= 1 + 1e-5
    assert one_class.norm() > 0.3  # concentrated in one row: much of the bound is used
    balanced = embed(fmap, images(30), torch.arange(30) % 10, 10)
    assert balanced.norm() <= 1 / math.sqrt(10) + 1e-5  # spread over C rows of weight 1/C each
    # The count coordinate of row c is sqrt(a) times the class's share of the data.
    assert torch.allclose(balanced[:, -1], torch.full((10,), math.sqrt(0.1) * 0.1), atol=1e-6)


def test_embed_in_chunks_equals_one_pass():
    fmap, x, y = FeatureMap(cfg()), images(50), torch.arange(50) % 10
    assert torch.allclose(embed(fmap, x, y, 10, chunk=7), class_means(fmap(x), y, 10), atol=1e-6)
    with pytest.raises(ValueError, match="non-empty"):
        embed(fmap, x[:0], y[:0], 10)


def test_clip_summary_scales_only_what_is_too_long():
    v = torch.full((10, 3), 0.5)
    assert torch.allclose(clip_summary(v, 1.0).norm(), torch.tensor(1.0))
    small = v / 100
    assert torch.equal(clip_summary(small, 1.0), small)


def test_one_release_then_the_budget_refuses_the_second():
    c = calibrate(cfg(target_epsilon=50.0, merf_clip=0.4), RANDOM_FOURIER)
    state = new_state(c, 0)
    assert state.discriminator is None and state.optimizer is None  # DP-MERF clients keep no D
    first = release(state, c, MerfRequest(step=0), NodePolicy(), family=RANDOM_FOURIER)
    assert not first.refused and first.embedding.shape == (10, 101) and first.embedding.dtype == np.float32
    assert state.ledger.queries == 1
    (event,) = state.ledger.history
    assert event.noise_multiplier == c.merf_noise_multiplier and event.sample_rate == 1.0
    assert state.ledger.epsilon(delta=c.delta) == pytest.approx(50.0, rel=1e-3)
    second = release(state, c, MerfRequest(step=1), NodePolicy(), family=RANDOM_FOURIER)
    assert second.refused and "would exceed the run's epsilon budget 50" in second.reason
    assert state.ledger.queries == 1


def test_release_is_the_clipped_summary_plus_noise_of_std_2_sigma_s():
    c = cfg(merf_noise_multiplier=0.0, merf_clip=0.2, merf_features=500)
    state = new_state(c, 1)
    clean = torch.from_numpy(
        release(state, c, MerfRequest(step=0), NodePolicy(allow_nonprivate=True), family=RANDOM_FOURIER).embedding
    )
    summary = embed(FeatureMap(c), state.data.images, state.data.labels, 10)
    assert summary.norm() > 0.2  # so the clip acts
    assert torch.allclose(clean, summary * 0.2 / summary.norm(), atol=1e-6)
    noisy_cfg = c.replace(merf_noise_multiplier=3.0)
    noisy = torch.from_numpy(
        release(new_state(noisy_cfg, 1), noisy_cfg, MerfRequest(step=0), NodePolicy(), family=RANDOM_FOURIER).embedding
    )
    std = float((noisy - clean).std())
    assert std == pytest.approx(2 * 3.0 * 0.2, rel=0.05)  # 10,010 coordinates
    assert float(noisy.norm()) <= honest_norm_bound(noisy_cfg, noisy.numel())


def test_calibration_recomputes_from_a_ledger():
    c = calibrate(cfg(target_epsilon=10.0, delta=1e-5), RANDOM_FOURIER)
    assert ledger_epsilon(c.merf_noise_multiplier, 1.0, 1, 1e-5) <= 10.0
    assert ledger_epsilon(c.merf_noise_multiplier * 0.99, 1.0, 1, 1e-5) > 10.0
    assert c.client_epsilon_budget == 10.0
    one = PrivacyLedger()
    assert one.would_exceed(budget=10.0, delta=1e-5, next_event=release_event(c)) is False


def release_event(c):
    from common.methods.dp_merf.privacy import planned_event

    return planned_event(c, RANDOM_FOURIER)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (MerfRelease(step=1, embedding=np.zeros((10, 101), np.float32)), "for step 1"),
        (MerfRelease(step=0), "no 'embedding'"),
        (MerfRelease(step=0, embedding=np.zeros((10, 99), np.float32)), "shape"),
        (MerfRelease(step=0, embedding=np.full((10, 101), np.nan, np.float32)), "NaN"),
        (MerfRelease(step=0, embedding=np.zeros((10, 101), np.int64)), "dtype int64, expected float32"),
        (MerfRelease(step=0, embedding=np.zeros((10, 101), np.uint8)), "dtype uint8, expected float32"),
        (MerfRelease(step=0, embedding=np.zeros((10, 101), bool)), "dtype bool, expected float32"),
        (MerfRelease(step=0, embedding=np.zeros((10, 101), np.float64)), "dtype float64, expected float32"),
        (MerfRelease(step=0, embedding=np.zeros((10, 101), np.float32), noise_multiplier=-1.0), "noise_multiplier"),
    ],
)
def test_a_malformed_release_is_named(payload, match):
    with pytest.raises(PayloadError, match=match):
        payload.decoded(step=0, shape=(10, 101))


def test_options_are_validated_by_name():
    for changes, name in (
        (dict(merf_clip=0.0), "merf_clip"),
        (dict(merf_clip=1.5), "merf_clip"),
        (dict(merf_dct=29), "merf_dct"),
        (dict(merf_count_share=1.0), "merf_count_share"),
        (dict(merf_features=0), "merf_features"),
        (dict(merf_lengthscale=-1.0), "merf_lengthscale"),
        (dict(merf_smoothness=-0.1), "merf_smoothness"),
    ):
        with pytest.raises(ConfigError, match=name):
            cfg(**changes)


def test_the_server_fits_g_to_the_target_and_reads_the_class_shares():
    c = cfg(merf_batch=8, merf_lr=3e-3, ema_decay=0.9)
    fmap = FeatureMap(c)
    x = images(200, seed=3) * 0.2  # a dim data set ...
    y = torch.cat([torch.zeros(100, dtype=torch.long), torch.arange(100) % 10])  # ... with class 0 over-represented
    target = embed(fmap, x, y, 10)
    g = MerfGenerator(c, 10, RANDOM_FOURIER)
    with pytest.raises(RuntimeError, match="no target"):
        g.step()
    g.set_target([target, target])
    shares = g.class_weights()
    assert shares[0] == pytest.approx(0.55, abs=1e-4) and shares[1] == pytest.approx(0.05, abs=1e-4)
    losses = [g.step() for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]
    state = g.state_dict()
    again = MerfGenerator(c, 10, RANDOM_FOURIER)
    again.load_state_dict(state)
    assert torch.equal(again.target, g.target) and again.releases == 2
    with pytest.raises(ValueError, match="target has shape"):
        MerfGenerator(c.replace(merf_features=20), 10, RANDOM_FOURIER).load_state_dict(state)


def test_roughness_is_the_mean_squared_step_between_neighbouring_pixels():
    assert float(roughness(torch.full((2, 1, 28, 28), 0.7))) == 0.0
    rows = torch.arange(28.0).view(1, 1, 28, 1).expand(1, 1, 28, 28) / 27  # a vertical ramp: dy 1/27, dx 0
    assert float(roughness(rows)) == pytest.approx(1 / 27**2)
    checker = ((torch.arange(28).view(-1, 1) + torch.arange(28).view(1, -1)) % 2).float().view(1, 1, 28, 28)
    assert float(roughness(checker)) == pytest.approx(2.0)  # salt and pepper at its worst: every step is 1


def test_the_smoothness_penalty_keeps_g_from_drawing_a_noisy_target_as_pixel_noise():
    """A target as noisy as DP-MERF's at ε 1 (noise norm about its signal's): G fitted with the penalty
    draws smoother samples than G fitted without it, from the same seed, target and steps."""
    c = cfg(merf_batch=8, merf_lr=3e-3, ema_decay=0.9, merf_dct=0)
    fmap = FeatureMap(c)
    target = embed(fmap, images(200, seed=4) * 0.5, torch.arange(200) % 10, 10)
    noise = torch.randn(target.shape, generator=torch.Generator().manual_seed(5))
    target = target + noise * float(target.norm()) / float(noise.norm())

    def fitted_roughness(weight: float) -> float:
        g = MerfGenerator(c.replace(merf_smoothness=weight), 10, RANDOM_FOURIER)
        g.set_target([target])
        for _ in range(60):
            g.step()
        z = torch.randn(100, c.z_dim, generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            return float(roughness(g.model(z, torch.arange(100) % 10)))

    assert fitted_roughness(1.0) < 0.5 * fitted_roughness(0.0)


def test_small_partitions_are_fine_for_a_method_that_draws_no_batches():
    from common.data import check_partition_sizes
    from common.methods import method

    small = dict(synthetic_samples_per_writer=5, batch_size=32)
    merf = cfg(**small)
    assert check_partition_sizes(merf, need=method(merf.strategy).min_client_images(merf)) == [5, 5, 5, 5]
    with pytest.raises(ConfigError, match="batch_size=32: larger than a client's partition"):
        cfg(**small, strategy="gswgan")


# --- the client side (through the client's shell: real nodes in this process) ---------------------
def test_each_node_releases_once_charged_to_its_node_ledger_and_refuses_a_second(tmp_path):
    c = cfg(out=str(tmp_path / "run"), num_clients=3, progress=False)
    transport, nodes = federation(c)
    _, outcome = one_step(c, transport, nodes, asked=[0, 1, 2])
    assert outcome.took_step and not outcome.failed_nodes
    root = os.environ[NODE_STATE_ENV]
    assert [read_node_book(root, k).by_method for k in range(3)] == [{"dp-merf": 1}] * 3
    _, again = one_step(c, transport, nodes, asked=[1])  # one release per node, whatever the run
    assert again.exhausted_nodes == [nodes[1]] and "already released its DP-MERF summary" in again.notes[0]
    assert read_node_book(root, 1).ledger.queries == 1


def test_a_run_split_into_many_sums_is_told_what_one_sum_would_save():
    """K clients in sums of c leave the mean K/t releases' worth of noise (t = ⌈2c/3⌉ per share);
    the note names the one-sum figure, and stays silent when it would not help."""
    cfg = ExperimentConfig(strategy="dp-merf", num_clients=3000, secure_aggregation=True, secagg_cohort=1000)
    note = cohort_noise_note(cfg, RANDOM_FOURIER)
    assert "3 sums" in note and "t = 667" in note and "4.5 releases'" in note and "--secagg-cohort 3000" in note
    assert f"{math.sqrt(666 / 1999):.2f}x" in note  # (t - k) of a sum of 1,000 over that of one of 3,000
    with_colluder = cohort_noise_note(cfg.replace(secagg_colluders=1), RANDOM_FOURIER)
    assert f"{3000 / 666:.1f} releases'" in with_colluder
    assert cohort_noise_note(cfg.replace(secagg_cohort=3000), RANDOM_FOURIER) == ""  # one sum already
    assert cohort_noise_note(cfg.replace(secagg_cohort=1600), RANDOM_FOURIER) == ""  # 1 sum of 3,000 (c to 2c - 1)
    # in the clear: K releases' noise; a fixed t: no larger sum lowers it
    assert cohort_noise_note(cfg.replace(secure_aggregation=False), RANDOM_FOURIER) == ""
    assert cohort_noise_note(cfg.replace(secagg_threshold=600), RANDOM_FOURIER) == ""


def test_a_seeded_runs_seed_stage_is_told_about_its_sums_too():
    from common.methods import schedule_notes

    cfg = ExperimentConfig(
        strategy="gswgan",
        num_clients=3000,
        secure_aggregation=True,
        secagg_cohort=1000,
        init_release="dp-merf",
        target_epsilon=10.0,
        init_epsilon=8.0,
        clients_per_step=8,
    )
    notes = schedule_notes(cfg)
    assert notes[0].startswith("seed stage (dp-merf): --secagg-cohort 1000 splits the 3,000 clients into 3 sums")
    assert not any("seed stage" in n for n in schedule_notes(cfg.replace(secagg_cohort=3000)))
