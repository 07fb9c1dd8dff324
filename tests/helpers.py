"""What many tests share: the repository root, the tiny run, and the node policy of testing options.

The tiny run is the smallest configuration that exercises every part of a method (a few clients,
the tiny model, a handful of samples); tests change what they are about and keep the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.codec import GsQuery, samples_per_query
from common.config import ExperimentConfig
from simulations.cli import config_flags

ROOT = Path(__file__).resolve().parents[1]

# A fixed noise seed makes runs reproducible but voids every guarantee, so a node refuses it unless
# its own policy allows non-private options: tests that need exact reproducibility pin such a policy
# on their (simulated) nodes, the way a user debugging on public data would.
ALLOW_NONPRIVATE = {"privacy-allow-nonprivate": True}
# Fed-Avg GAN's clients send raw deltas for the server to noise: a node takes part only when its
# policy trusts the server (the shipped policy file ``fedgan simulate --node-policy`` names).
TRUST_SERVER_POLICY = ROOT / "simulations" / "configs" / "policies" / "trust-server.toml"

TINY = dict(
    num_clients=3,
    model="tiny",
    batch_size=8,
    n_critic=1,
    synthetic_samples_per_writer=40,
    dpgan_batch_size=16,
    dpgan_n_d=2,
    fedavg_clients_per_round=2,
    progress=False,
    eval=False,
)


# ``values`` as the command line spells them (booleans as --x / --no-x; None leaves a flag out).
flags = config_flags


def tiny_flags(**changes: object) -> list[str]:
    """The tiny run as flags (in-process), with ``changes``; ``name=None`` drops a flag."""
    return flags(**{"transport": "inprocess", **TINY, **changes})


TINY_FLAGS = tiny_flags()


def tiny_cfg(out: Path | str = "", **changes) -> ExperimentConfig:
    """The tiny run, with ``changes``; written to ``out``."""
    return ExperimentConfig(**{**TINY, "out": str(out), **changes})


def gs_query(cfg: ExperimentConfig, step: int = 0) -> GsQuery:
    """A GS-WGAN query of random "fake" samples, shaped as ``cfg``'s server would send it."""
    rng = np.random.default_rng(step)
    n = samples_per_query(cfg.batch_size, cfg.n_critic, cfg.critic_fakes)
    return GsQuery(
        step=step,
        batch_size=cfg.batch_size,
        fake=rng.random((n, 1, 28, 28), dtype=np.float32),
        labels=rng.integers(0, 10, n),
    )


def wait_until(condition: Callable[[], object], *, timeout_s: float, what: str, every_s: float = 0.05) -> object:
    """Poll ``condition`` until it is true (returned) or ``timeout_s`` passes (AssertionError naming
    ``what``): tests wait for what they need, never a fixed time that a loaded machine can outlast."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(every_s)
