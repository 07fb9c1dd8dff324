"""The registry of methods: the one place that knows every method.

A method is one folder, ``common/methods/<name>/``, whose ``METHOD`` satisfies the contract in
``protocol.py``; adding one is its folder and one line in ``FOLDERS``. Everything else reaches a
method through ``method(name)`` and the contract, never by comparing its name, and the generic
modules of ``common`` never import this package: they are handed what they need.

Here too, because only the registry knows every method's section: ``ExperimentConfig`` (the run's
options composed with each method's, ``common/config.py``), the catalogue of messages, and
``prepare`` (what every entry point does to a configuration before any work).
"""

from __future__ import annotations

import importlib
from typing import Any

from common.channels import channel_for, checked_channel
from common.config import compose_config
from common.messages import SHARED
from common.options import check, option
from common.privacy import RunTerms
from common.run_options import TARGET_EPSILON_HELP
from common.secagg.plan import fewest_survivors

from . import seeding
from .protocol import Method

FOLDERS = (  # one line per method: its folder under common/methods/
    "gswgan",
    "dpgan",
    "fedavg_gan",
    "dp_merf",
    "dp_ntk",
)

METHODS: dict[str, Method] = {
    m.name: m for m in (importlib.import_module(f"{__name__}.{folder}").METHOD for folder in FOLDERS)
}


def method(name: str) -> Method:
    """The method called ``name`` (its ``--strategy``); a ValueError naming the known ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"strategy {name!r} is not implemented; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def _check_method(cfg: Any) -> None:
    """What depends on the run's method: it exists, DPAC only where it has a form, and a client's
    partition holds what the method needs of it."""
    check(cfg.strategy in METHODS, "strategy", cfg.strategy, f"choose one of {tuple(METHODS)}")
    check(
        cfg.dpac_beta == 1 or METHODS[cfg.strategy].supports_dpac,
        "dpac_beta",
        cfg.dpac_beta,
        f"strategy {cfg.strategy} has no DPAC form (these do: "
        f"{', '.join(m.name for m in METHODS.values() if m.supports_dpac)}); use 1",
    )
    _check_channel(cfg, METHODS[cfg.strategy])
    METHODS[cfg.strategy].check_run(cfg)
    seeding.check_run(cfg, METHODS[cfg.strategy])
    if cfg.dataset == "synthetic" and cfg.partition == "writer":
        check(
            METHODS[cfg.strategy].min_client_images(cfg) <= cfg.synthetic_samples_per_writer,
            "batch_size",
            cfg.batch_size,
            f"larger than a client's partition ({cfg.synthetic_samples_per_writer} images per writer)",
        )


def _check_channel(cfg: Any, run_method: Method) -> None:
    """The run's release channel exists, its method admits what the channel needs (a summing channel
    a method that takes a revealed sum), and the channel's own checks of the method's release."""
    channel = checked_channel(cfg)
    admits = [m.name for m in METHODS.values() if not channel.needs or channel.needs in m.channel_needs]
    check(
        not channel.needs or channel.needs in run_method.channel_needs,
        channel.option,
        getattr(cfg, channel.option),
        f"strategy {cfg.strategy} has no {channel.name} form (these do: {', '.join(admits) or 'none'})",
    )
    spec = run_method.release_spec(cfg)
    if spec is not None:
        channel.check_run(cfg, spec)


def _validate(cfg: Any) -> None:
    """Every method's section's checks, then what depends on the run's method."""
    for m in METHODS.values():
        m.validate(cfg)
    seeding.validate(cfg)
    _check_method(cfg)


STRATEGY = option(
    "gswgan",
    f"training strategy, one of {', '.join(METHODS)}; the source papers' further methods are options of "
    "these: DPAC (--dpac-beta < 1) federated with gswgan and centralized with dpgan; dpGAN's public-data "
    "warm start (--public-data, --public-warmup-steps) with all three, its grouped and adaptive clipping "
    "(--dpgan-clip-groups, --dpgan-group-bounds) with dpgan",
)


def _names(which: Any) -> str:
    return ", ".join(name for name, m in METHODS.items() if which(m)) or "none"


# Help texts that list methods are written here, from the registry, never by hand
TARGET_EPSILON = option(
    0.0, TARGET_EPSILON_HELP.format(units="; ".join(f"{n}: {m.target_unit}" for n, m in METHODS.items()))
)
INIT_RELEASE = option(
    seeding.NONE,
    seeding.INIT_RELEASE_HELP.format(seeds=_names(lambda m: m.seeds), takers=_names(lambda m: m.accepts_seed)),
)
ExperimentConfig = compose_config(
    (*(m.options for m in METHODS.values()), seeding.Options),
    _validate,
    fields={
        "strategy": ("str", STRATEGY),
        "target_epsilon": ("float", TARGET_EPSILON),
        "init_release": ("str", INIT_RELEASE),
    },
    module=__name__,
)


def run_terms(cfg: ExperimentConfig) -> RunTerms:
    """What the run's method says of the releases a node would make in it, for the node's policy."""
    run_method, channel = method(cfg.strategy), channel_for(cfg)
    spec = run_method.release_spec(cfg)
    if spec is None:  # a method whose releases take no channel (DPGAN's DP-SGD steps)
        noise, revealed, cohort, bounded = run_method.release_noise(cfg), 0.0, 0, False
    else:
        noise, revealed = channel.node_noise(cfg, spec), channel.revealed_noise(cfg, spec)
        cohort, bounded = channel.cohort(cfg, spec), channel.bounds_every_release
    return RunTerms(
        release_noise=noise,
        protocol_release_noise=revealed,
        # through a secure sum a client's delta is clipped and noised on the node: bounded against the server
        unbounded_against_server=run_method.unbounded_against_server and not bounded,
        nonprivate_options=tuple(run_method.nonprivate_options(cfg)),
        secagg_cohort=cohort,
        secagg_floor=fewest_survivors(cohort, cfg.secagg_threshold) if cohort else 0,
        secagg_colluders=cfg.secagg_colluders if cohort else 0,
    )


def catalogue() -> dict[str, tuple[type, type]]:
    """Message type -> (request payload, reply payload), the shared ones and every method's."""
    out: dict[str, tuple[type, type]] = dict(SHARED)
    for m in METHODS.values():
        out.update(m.messages)
    return out


def method_of_message(message_type: str) -> Method:
    """The method whose message ``message_type`` is (a KeyError for a shared or unknown one)."""
    for m in METHODS.values():
        if message_type in m.messages:
            return m
    raise KeyError(f"no method sends {message_type!r}")


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """``cfg`` with its method's noise set for ``cfg.target_epsilon`` (unchanged when it is 0). A
    seeded run's seed release first, for its share (``init_epsilon``); then the run's method for the
    total, composed with what the seed release charged each client (``prior``)."""
    if cfg.target_epsilon <= 0:
        return cfg
    if seeding.seeded(cfg):
        cfg = seeding.calibrate_seed(cfg, pooled_size=pooled_size)
    prior = seeding.seed_events(cfg)
    return method(cfg.strategy).calibrate(cfg, pooled_size=pooled_size, prior=prior)


def prepare(cfg: ExperimentConfig) -> ExperimentConfig:
    """What every entry point does before any work: check that the device exists here, check
    partition sizes against what a client needs (reading the data where needed), that the test
    split an evaluation will need is there, the method's own checks against the data, and apply the
    --target-epsilon calibration."""
    from common.data import check_partition_sizes, load_dataset
    from common.device import resolve_device

    run_method = method(cfg.strategy)
    resolve_device(cfg.device)  # ValueError naming the device and what to use instead
    sizes = check_partition_sizes(cfg, need=run_method.min_client_images(cfg))
    if cfg.eval and cfg.dataset != "synthetic":  # the end-of-run evaluation needs the test split: now, not then
        load_dataset(cfg.dataset, cfg.data_dir, split="test", emnist_split=cfg.emnist_split)
    run_method.check_sizes(cfg, sizes)  # ConfigError naming the field
    return calibrate(cfg, pooled_size=sum(sizes))


def schedule_notes(cfg: ExperimentConfig) -> list[str]:
    """The run's method on its calibrated schedule (``Method.schedule_notes``): printed as a run
    starts, so budget the plan leaves unspent is seen before hours of training, not in the summary. A
    seeded run's seed stage says its own first, named as the seed's."""
    notes = method(cfg.strategy).schedule_notes(cfg)
    if not seeding.federated(cfg):  # a curator's seed (``seeding/pooled.py``) has no schedule of its own
        return notes
    first = seeding.seed_config(cfg)
    return [f"seed stage ({first.strategy}): {note}" for note in method(first.strategy).schedule_notes(first)] + notes


__all__ = [
    "METHODS",
    "ExperimentConfig",
    "Method",
    "calibrate",
    "catalogue",
    "method",
    "method_of_message",
    "prepare",
    "run_terms",
    "schedule_notes",
]
