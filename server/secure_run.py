"""A secure sum's state on the server as its four rounds go (``secure_sum.py`` drives them): what
the caller gets back (``SecureSumResult``) and what the driver knows on the way (``SumRun``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.secagg import fewest_inputs

from .secure_checks import Advertised

STAGES = ("advertise", "share", "mask", "unmask")


class Aborted(Exception):
    """The sum cannot be revealed; the message says why (nothing is unmasked)."""


@dataclass
class SecureSumResult:
    """A secure sum's outcome: the sum (None when aborted, with the reason), who is in it, who
    dropped at which round and why, and what each round cost."""

    session: str
    cohort: list[int]
    threshold: int
    degree: int
    bits: int
    bound: int
    min_inputs: int = 0  # the fewest inputs a revealed sum holds (0: the threshold)
    sum: np.ndarray | None = None  # int64: the signed sum of the survivors' inputs
    sum_mod: np.ndarray | None = None  # uint64: the same sum's residues mod 2^bits
    survivors: list[int] = field(default_factory=list)  # the nodes whose inputs are in the sum
    dropouts: dict[int, str] = field(default_factory=dict)  # node -> "round: why"
    culprits: dict[int, str] = field(default_factory=dict)  # node -> what it did (named on evidence)
    aborted: str = ""
    out_of_range: bool = False  # rejected: the unmasked sum betrayed an input outside its range
    bytes_by_stage: dict[str, dict[str, int]] = field(default_factory=dict)  # round -> down, up (all nodes)
    seconds_by_stage: dict[str, float] = field(default_factory=dict)

    @property
    def revealed(self) -> bool:
        return self.sum is not None

    def bytes_per_client(self) -> float:
        """Bytes down plus up per member of the cohort, over every round."""
        total = sum(s["down"] + s["up"] for s in self.bytes_by_stage.values())
        return total / max(1, len(self.cohort))


@dataclass
class SumRun:
    """What the server knows as the rounds go."""

    result: SecureSumResult
    params: dict[str, int]  # what AdvertiseKeys declares: cohort, threshold, degree, bits, bound, length
    graph: dict[int, set[int]]
    timeout_s: float | None
    peers: frozenset[bytes] | None = None  # the federation's published identities, when the server has them
    seen: set[bytes] | None = None  # digests of every masked vector of the caller's earlier sums
    active: set[int] = field(default_factory=set)
    advertised: dict[int, Advertised] = field(default_factory=dict)
    commitments: dict[int, bytes] = field(default_factory=dict)  # node -> its seed commitment
    inbox: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # recipient -> (sender, token)
    partners: dict[int, list[int]] = field(default_factory=dict)  # node -> the senders it masked with
    total: np.ndarray | None = None  # Σ masked inputs, uint64
    refusals: dict[int, Any] = field(default_factory=dict)  # the last round's refusals, by node

    def mask_key(self, node: int) -> bytes:
        return self.advertised[node].mask_key

    @property
    def length(self) -> int:
        return self.params["length"]

    @property
    def session(self) -> str:
        return self.result.session

    @property
    def threshold(self) -> int:
        return self.result.threshold

    @property
    def floor(self) -> int:
        """The fewest inputs a revealed sum may hold."""
        return fewest_inputs(self.result.threshold, self.result.min_inputs)

    def drop(self, node: int, stage: str, why: str) -> None:
        self.active.discard(node)
        self.result.dropouts.setdefault(node, f"{stage}: {why}")

    def blame(self, node: int, stage: str, why: str) -> None:
        """``node`` did what no honest node does: out of this sum, and named."""
        self.result.culprits.setdefault(node, f"{stage}: {why}")
        self.drop(node, stage, f"named: {why}")
