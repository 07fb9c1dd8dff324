"""What a method's server side asks the shells for when its releases are summed securely
(``SumRequest``), and what the shells hand back (``SumResult``): the seam between a summing release
channel (``common/channels/secure_sum.py``) and the shells' drivers (``server/secure_sum.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SumRequest:
    """A secure sum a server side asks the shells to run after a step's replies (SecAgg+,
    ``server/secure_sum.py``): the integer vectors ``nodes`` deposited for ``session`` (each
    ``length`` coordinates in [-bound, bound]), neighbourhoods of ``degree`` + 1 sharing secrets with
    ``threshold``, no sum revealed of fewer than ``min_inputs`` inputs."""

    session: str
    nodes: list[int]
    bound: int
    length: int
    threshold: int
    degree: int
    min_inputs: int
    seen: set[bytes] | None = None  # the run's masked-vector digests (a replayed masked vector is named)


@dataclass
class SumResult:
    """What a secure sum revealed: the signed sum of the ``survivors``' vectors, or None with the
    reason it aborted; ``dropouts``: node -> the round it dropped at and why."""

    session: str
    survivors: list[int] = field(default_factory=list)
    total: Any = None  # numpy int64 vector, or None
    aborted: str = ""
    dropouts: dict[int, str] = field(default_factory=dict)
    culprits: dict[int, str] = field(default_factory=dict)  # node -> what it did: named on evidence, never asked again
    attempts: int = 1  # sums run: a sum aborted by named culprits is re-formed without them
    suspects: list[int] = field(default_factory=list)  # a sum rejected for an out-of-range input: its inputs' nodes
