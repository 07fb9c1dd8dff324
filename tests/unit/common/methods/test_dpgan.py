"""Centralized DPGAN's core: the curator's secret Poisson batches, its events, its options."""

from __future__ import annotations

import torch

from common.methods import ExperimentConfig
from common.methods.dpgan.curator import new_node
from common.privacy.sampling import VOID_SAMPLING_SEED


def _node_cfg(**changes) -> ExperimentConfig:
    return ExperimentConfig(
        strategy="dpgan", num_clients=2, model="tiny", synthetic_samples_per_writer=40, dpgan_batch_size=16, **changes
    )


def test_curator_batches_are_secret_unless_the_testing_flag_says_otherwise() -> None:
    """The run's seed is published in config.json: two curators of the same run must not draw the
    same Poisson batches, or amplification at q = B/N would not hold. --sampling-seed reproduces
    them, and marks every step void."""
    a, b = new_node(_node_cfg(seed=0)), new_node(_node_cfg(seed=0))
    draws = [[n.sampler.poisson(len(n.labels), n.sample_rate).tolist() for _ in range(5)] for n in (a, b)]
    assert draws[0] != draws[1] and a.void == ""
    c, d = new_node(_node_cfg(sampling_seed=4)), new_node(_node_cfg(sampling_seed=4))
    assert torch.equal(c.sampler.poisson(80, 0.2), d.sampler.poisson(80, 0.2))
    assert c.void == VOID_SAMPLING_SEED and c.step_event(3).void == VOID_SAMPLING_SEED
