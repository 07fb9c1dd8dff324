"""Payloads exchanged between server and clients, and their validation.

The payloads are plain dataclasses of numpy arrays and scalars so they can travel over any
transport (Flower messages in simulation, the project's own stream in deployment). Everything that
arrives from the other side is validated here before it touches a model: a wrong shape, a NaN or an
oversized payload becomes a ``PayloadError`` naming the field, never a crash deep inside autograd.
Lossy wire dtypes are applied by ``to_wire`` *after* the client added its noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

WIRE_NUMPY = {"float32": np.float32, "float16": np.float16}
# A generous upper bound on one answer: B x 784 float32 for B up to 4096.
MAX_ANSWER_BYTES = 4096 * 28 * 28 * 4


class PayloadError(ValueError):
    """A payload from the other side is malformed; the message names the field and the problem."""


@dataclass
class GsQuery:
    """Server -> client, one generator step of GS-WGAN.

    ``fake`` holds (n_critic + 1) * B generated images; the first n_critic batches train the
    client's discriminator, the last batch is the one whose generator gradient is returned.
    ``labels`` are drawn uniformly by the server (never from a client's label histogram).
    """

    step: int
    batch_size: int
    fake: np.ndarray
    labels: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {"fake": self.fake, "labels": self.labels}

    def scalars(self) -> dict[str, Any]:
        return {"step": self.step, "batch_size": self.batch_size}


@dataclass
class GsAnswer:
    """Client -> server: the sanitized per-sample gradients of one query, or a refusal.

    ``noise_multiplier`` / ``sample_rate`` describe the Gaussian mechanism the client ran (its
    ledger entry), so the server's mirror of the ledger is driven by what actually ran.
    """

    step: int
    client_id: int
    refused: bool = False
    reason: str = ""
    grad: np.ndarray | None = None
    noise_multiplier: float = 0.0
    sample_rate: float = 0.0
    queries: int = 0
    epsilon: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        return {} if self.grad is None else {"grad": self.grad}

    def scalars(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "client_id": self.client_id,
            "refused": self.refused,
            "reason": self.reason,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "queries": self.queries,
            "epsilon": self.epsilon,
        }


def to_wire(array: np.ndarray, wire_dtype: str) -> np.ndarray:
    """Cast a float array to the wire dtype (call only on already-sanitized data)."""
    return np.ascontiguousarray(array, dtype=WIRE_NUMPY[wire_dtype])


def from_wire(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float32)


def validate_query(query: GsQuery, *, n_critic: int, num_classes: int) -> None:
    """Check a query against what the client's configuration expects."""
    expected = ((n_critic + 1) * query.batch_size, 1, 28, 28)
    _check_shape("fake", query.fake, expected)
    _check_finite("fake", query.fake)
    _check_shape("labels", query.labels, expected[:1])
    if query.labels.size and (query.labels.min() < 0 or query.labels.max() >= num_classes):
        raise PayloadError(f"labels must lie in [0, {num_classes}), got range "
                           f"[{query.labels.min()}, {query.labels.max()}]")


def validate_answer(answer: GsAnswer, *, batch_size: int, step: int) -> None:
    """Check a client's answer before the server backpropagates it through G."""
    if answer.step != step:
        raise PayloadError(f"answer is for step {answer.step}, expected step {step}")
    if answer.refused:
        return
    if answer.grad is None:
        raise PayloadError("answer carries no 'grad' array")
    if answer.grad.nbytes > MAX_ANSWER_BYTES:
        raise PayloadError(f"grad payload of {answer.grad.nbytes} bytes exceeds {MAX_ANSWER_BYTES}")
    _check_shape("grad", answer.grad, (batch_size, 1, 28, 28))
    _check_finite("grad", answer.grad)
    if not (answer.noise_multiplier >= 0 and 0 < answer.sample_rate <= 1):
        raise PayloadError(
            f"invalid privacy event: noise_multiplier={answer.noise_multiplier}, "
            f"sample_rate={answer.sample_rate}"
        )


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    if tuple(array.shape) != tuple(expected):
        raise PayloadError(f"{name} has shape {tuple(array.shape)}, expected {tuple(expected)}")


def _check_finite(name: str, array: np.ndarray) -> None:
    if not np.all(np.isfinite(array)):
        raise PayloadError(f"{name} contains NaN or infinite values")
