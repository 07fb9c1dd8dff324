"""Sampling that privacy amplification relies on: secret, from the OS CSPRNG.

Amplification by subsampling (a server picking m of K clients, DP-SGD's Poisson batches) holds
only if the adversary cannot predict who was sampled. A generator seeded from the run's published
``seed`` is predictable (config.json holds it), so every sample here comes from ``os.urandom``
(through ``secrets``), held only where the sampling happens, with no state to save or leak.

``seed`` (the ``--sampling-seed`` testing flag) makes the draws reproducible with a torch generator
instead; that voids every figure that relies on the sampling, which ``void_reason`` says and the
events recorded with it carry.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")
VOID_SAMPLING_SEED = (
    "reproducible sampling (--sampling-seed, testing only): who was sampled is predictable "
    "from the published configuration, so amplification by subsampling does not hold"
)


class Sampler:
    """Uniform fixed-size and Poisson samples, secret unless ``seed`` is given (tests only)."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        self._system = secrets.SystemRandom()

    @property
    def secret(self) -> bool:
        return self._generator is None

    @property
    def void_reason(self) -> str:
        """The void mark of the events whose amplification rests on this sampler ("" when secret)."""
        return "" if self.secret else VOID_SAMPLING_SEED

    def choose(self, items: Sequence[T], m: int) -> list[T]:
        """``m`` of ``items`` uniformly at random without replacement (all of them if m ≥ len)."""
        m = min(int(m), len(items))
        if self._generator is not None:
            order = torch.randperm(len(items), generator=self._generator)[:m].tolist()
        else:
            order = self._system.sample(range(len(items)), m)
        return [items[i] for i in order]

    def poisson(self, n: int, sample_rate: float) -> torch.Tensor:
        """Indices (int64, ascending) of a Poisson sample: each of ``n`` kept with probability q.

        Secret draws compare 64-bit CSPRNG words with ⌊q·2^64⌋, so each index is kept with a
        probability at most q (never more than the accountant assumes) and within 2^-64 of it.
        """
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
        if self._generator is not None:
            return (torch.rand(n, generator=self._generator) < sample_rate).nonzero().flatten()
        if sample_rate >= 1.0:
            return torch.arange(n)
        words = np.frombuffer(os.urandom(8 * n), dtype="<u8")
        threshold = np.uint64(int(sample_rate * 2.0**64) if sample_rate < 1.0 else 2**64 - 1)
        return torch.from_numpy(np.flatnonzero(words < threshold).astype(np.int64))

    def state_dict(self) -> dict:
        """Seeded samplers continue exactly on resume; a secret one has nothing to keep."""
        return {"seed": self.seed, "state": None if self._generator is None else self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if self._generator is not None and state.get("state") is not None and state.get("seed") == self.seed:
            self._generator.set_state(state["state"])
