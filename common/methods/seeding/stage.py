"""The seed stage's plan: its configuration, what it costs each client, and the checks of a seeded run.

A seeded run is two stages over one federation and one set of client ledgers: stage 1 is the seed
method's own run (``--init-release``: DP-MERF's or DP-NTK's one-shot release, through the run's
channel), stage 2 the run's GAN, which starts from a generator the server fitted to the release.
Everything here is a function of the configuration, so the calibration (before any work), the node's
check of what it is asked, and the reports agree on what stage 1 cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.channels import channel_for
from common.options import check
from common.privacy import PrivacyEvent

from . import pooled
from .options import NONE

if TYPE_CHECKING:
    from common.methods import ExperimentConfig
    from common.methods.protocol import Method


def seeded(cfg: ExperimentConfig) -> bool:
    return cfg.init_release != NONE


def federated(cfg: ExperimentConfig) -> bool:
    """A seed stage of its own run over the federation (``server/seeded.py``), before the run's; not
    one a curator makes in the run's first round (``pooled``: a method that pools the data)."""
    return seeded(cfg) and not pooled.pools_data(cfg)


def seed_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """Stage 1's configuration: the seed method on the run's federation, data, model and channel, at
    the seed's share of the budget (and, once calibrated, its noise), ``init_steps`` generator steps
    on the server, no evaluation of its own. Its budget is its share: a client refuses a second seed
    release, and stage 2's budget (the total) covers both."""
    first = cfg.replace(
        strategy=cfg.init_release,
        init_release=NONE,
        target_epsilon=cfg.init_epsilon,
        client_epsilon_budget=cfg.init_epsilon,
        steps=cfg.init_steps,
        eval=False,
        eval_every=0,
        out="",
    )
    if cfg.init_noise_multiplier > 0:  # calibrated: the seed method's noise field holds it
        spec = _seed_method(cfg).release_spec(first)
        first = first.replace(**{spec.noise_field: cfg.init_noise_multiplier})
    return first


def _seed_method(cfg: ExperimentConfig) -> Method:
    from common.methods import method

    return method(cfg.init_release)


def seed_events(cfg: ExperimentConfig) -> list[PrivacyEvent]:
    """What stage 1 charges each client that releases: one release of the seed method through the
    run's channel, at the calibrated noise (none before the calibration or without a seed)."""
    if not seeded(cfg) or cfg.init_noise_multiplier <= 0:
        return []
    if pooled.pools_data(cfg):  # the curator's release, example-level
        return [pooled.seed_event(cfg)]
    first = seed_config(cfg)
    spec = _seed_method(cfg).release_spec(first)
    return [channel_for(first).events(first, spec)[0]]


def calibrate_seed(cfg: ExperimentConfig, *, pooled_size: int | None) -> ExperimentConfig:
    """``cfg`` with the seed release's noise set for ``init_epsilon`` (``init_noise_multiplier``)."""
    if pooled.pools_data(cfg):
        return pooled.calibrate(cfg)
    seed_method = _seed_method(cfg)
    first = seed_method.calibrate(seed_config(cfg.replace(init_noise_multiplier=0.0)), pooled_size=pooled_size)
    noise = getattr(first, seed_method.release_spec(first).noise_field)
    return cfg.replace(init_noise_multiplier=noise)


def check_run(cfg: ExperimentConfig, run_method: Method) -> None:
    """A seed only for a GAN that starts from one; the seed's own configuration passes every check
    (building it runs them, naming the field)."""
    if not seeded(cfg):
        return
    from common.methods import METHODS

    takers = ", ".join(m.name for m in METHODS.values() if m.accepts_seed) or "none"
    check(
        run_method.accepts_seed,
        "init_release",
        cfg.init_release,
        f"strategy {cfg.strategy} does not start from a seed release (these do: {takers}); use none",
    )
    check(
        not run_method.unbounded_against_server or channel_for(cfg).bounds_every_release,
        "init_release",
        cfg.init_release,
        f"strategy {cfg.strategy}'s per-client epsilon is unbounded in the clear, so nothing composes with a "
        "seed's: add --secure-aggregation",
    )
    if pooled.pools_data(cfg):
        pooled.check_run(cfg)
    seed_config(cfg)
