"""The seed stage's plan: its configuration, the calibration that composes both stages, the checks
that name the field, and what stage 2 derives from the seed (the anchor, the server's critic)."""

import math

import pytest
import torch

from common.channels import channel_for
from common.config import ConfigError
from common.learning.models import build_generator
from common.methods import ExperimentConfig, calibrate
from common.methods.gswgan.privacy import release_spec
from common.methods.seeding import SeedAnchor, SeedStart, seed_config, seed_events, server_critic
from common.privacy import PrivacyEvent, PrivacyLedger


def cfg(**changes) -> ExperimentConfig:
    base = dict(
        strategy="gswgan",
        num_clients=20,
        clients_per_step=3,
        steps=10,
        batch_size=16,
        model="tiny",
        merf_features=50,
        target_epsilon=10.0,
        init_release="dp-merf",
        init_epsilon=2.0,
        eval=False,
    )
    return ExperimentConfig(**{**base, **changes})


@pytest.mark.parametrize("secure", [False, True])
def test_the_calibration_spends_the_total_on_both_stages_composed(secure):
    """The seed's σ reaches its share; GS-WGAN's then reaches the total composed with it (not the
    total minus the share: RDP composition spends less), and the clients' budget is the total."""
    extra = dict(secure_aggregation=True, secagg_cohort=5) if secure else {}
    c = calibrate(cfg(**extra))
    assert c.init_noise_multiplier > 0 and c.client_epsilon_budget == 10.0
    (seed_event,) = seed_events(c)
    assert PrivacyLedger([seed_event]).epsilon(delta=c.delta) == pytest.approx(2.0, rel=1e-3)
    queries = math.ceil(c.steps * c.clients_per_step / c.num_clients)
    answer = channel_for(c).events(c, release_spec(c))[0]
    both = PrivacyLedger([seed_event, answer.times(queries)]).epsilon(delta=c.delta)
    assert both <= 10.0 + 1e-9 and both == pytest.approx(10.0, rel=2e-3)
    alone = calibrate(cfg(init_release="none", init_epsilon=0.0, **extra))
    assert c.noise_multiplier > alone.noise_multiplier  # the seed's share costs stage 2 some noise


def test_the_seed_stage_is_the_seed_methods_run_at_its_share():
    c = calibrate(cfg(init_steps=33))
    first = seed_config(c)
    assert (first.strategy, first.init_release, first.steps) == ("dp-merf", "none", 33)
    assert first.target_epsilon == first.client_epsilon_budget == 2.0
    assert first.merf_noise_multiplier == c.init_noise_multiplier and not first.eval


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(init_epsilon=10.0), "init_epsilon"),
        (dict(init_epsilon=0.0), "init_epsilon"),
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(init_release="merf"), "init_release"),
        # DPGAN's curator reads the pooled size from the release's count coordinate (seeding/pooled.py)
        (dict(strategy="dpgan", merf_count_share=0.0), "merf_count_share"),
        (dict(strategy="dp-merf"), "init_release"),
        (dict(strategy="fedavg-gan", fedavg_g_optimizer="adam"), "init_release"),  # unbounded in the clear
        # the anchor's gradient, unscaled by SGD, collapsed the seed (issue 42's measurement)
        (dict(strategy="fedavg-gan", secure_aggregation=True, secagg_cohort=5), "fedavg_g_optimizer"),
        (dict(init_weight=-1.0), "init_weight"),
    ],
)
def test_a_seeded_run_that_cannot_be_is_a_config_error_naming_the_field(changes, field):
    with pytest.raises(ConfigError, match=f"invalid {field}="):
        cfg(**changes)


def test_fedavg_is_seeded_through_secure_sums():
    c = calibrate(
        cfg(
            strategy="fedavg-gan",
            secure_aggregation=True,
            secagg_cohort=5,
            fedavg_clients_per_round=5,
            fedavg_g_optimizer="adam",
        )
    )
    assert c.fedavg_noise_multiplier > 0 and seed_events(c)


def _start(c: ExperimentConfig) -> SeedStart:
    torch.manual_seed(0)
    g = build_generator(c.model, z_dim=c.z_dim, num_classes=10)
    return SeedStart(generator=g.state_dict(), target=torch.zeros(10, 2 * c.merf_features + 1), releases=5)


def test_the_anchor_pulls_g_towards_the_released_embedding():
    c = cfg(init_weight=1.0, merf_batch=4)
    start = _start(c)
    anchor = SeedAnchor(c, start, torch.device("cpu"))
    torch.manual_seed(1)  # a reachable target: another generator's embedding, classes equally likely
    other = build_generator(c.model, z_dim=c.z_dim, num_classes=10)
    y = torch.arange(10).repeat_interleave(20)
    with torch.no_grad():
        anchor.target = 0.1 * anchor.fmap.class_means(other(torch.randn(200, c.z_dim), y), y, 10, total=20)
    g = build_generator(c.model, z_dim=c.z_dim, num_classes=10)
    g.load_state_dict(start.generator)
    opt = torch.optim.Adam(g.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        losses.append(anchor.backward(g))
        opt.step()
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])


def test_the_server_critic_is_derived_the_same_way_twice():
    c = cfg(init_critic_steps=4, n_critic=2)
    one, two = server_critic(c, _start(c), 10), server_critic(c, _start(c), 10)
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    fresh = server_critic(c.replace(init_critic_steps=0), _start(c), 10)
    assert any(not torch.equal(one[k], fresh[k]) for k in one)  # the steps moved it


def test_dpgans_calibration_spends_the_total_on_its_curators_seed_and_dp_sgd():
    """DPGAN's seed is its curator's release, example-level (``seeding/pooled.py``): one Gaussian at
    the seed's share, then σ for DP-SGD's steps composed after it, at least the σ without a seed."""
    seeded = calibrate(cfg(strategy="dpgan", dpgan_batch_size=64, dpgan_n_d=5, steps=300), pooled_size=6000)
    alone = calibrate(seeded.replace(init_release="none", init_epsilon=0.0), pooled_size=6000)
    (seed,) = seed_events(seeded)
    assert seed.sample_rate == 1.0 and seed.noise_multiplier == seeded.init_noise_multiplier
    assert PrivacyLedger([seed]).epsilon(delta=seeded.delta) == pytest.approx(2.0, rel=1e-3)
    q, steps = 64 / 6000, 300 * 5
    dp_sgd = PrivacyEvent(
        noise_multiplier=seeded.dpgan_noise_multiplier, sample_rate=q, count=steps, sampling="poisson"
    )
    total = PrivacyLedger([seed, dp_sgd]).epsilon(delta=seeded.delta)
    assert 9.9 < total <= 10.0
    assert seeded.dpgan_noise_multiplier > alone.dpgan_noise_multiplier  # the seed's share is paid for
