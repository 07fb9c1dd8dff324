"""GS-WGAN's messages: ``train.gswgan`` carries a ``GsQuery`` and its ``GsAnswer``.

The query's samples and the answer's gradients travel in the array encodings of ``common/io/codec.py``;
each payload's ``decoded`` validates it against what its receiver expects (``protos/wire.py`` calls
it), so what reaches a model has been checked at the boundary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from common.io.codec import PayloadError, decode_grads, decode_labels, decode_samples

MSG_QUERY = "train.gswgan"


@dataclass
class GsQuery:
    """Server -> client, one generator step of GS-WGAN.

    ``fake`` holds the generated images in the wire encoding ``fake_encoding`` ("" = a raw array of
    its own dtype): (n_critic + 1) * B of them with fresh critic fakes (the first n_critic batches
    train the client's discriminator, the last batch is the one whose generator gradient is
    returned), or only the query batch of B when the client reuses fakes for its critic steps.
    ``labels`` are drawn uniformly by the server (never from a client's label histogram).
    """

    step: int
    batch_size: int
    fake: np.ndarray
    labels: np.ndarray
    fake_encoding: str = ""
    session: str = ""  # secure aggregation: deposit the answer for this secure sum instead of sending it
    # A seeded run: the server's critic (name -> array), sent once with a client's first query; its
    # D starts from it (``common/methods/seeding``). Public, and D is never released: a wrong one
    # costs only the client's D its head start.
    critic: dict[str, torch.Tensor] | None = None

    def decoded(self, *, n_critic: int, num_classes: int, critic_fakes: str = "fresh") -> GsQuery:
        """The query with its samples as float32 images and its labels as int64, validated against
        what the client's configuration expects (``validate_query``)."""
        fakes, labels = validate_query(self, n_critic=n_critic, num_classes=num_classes, critic_fakes=critic_fakes)
        return dataclasses.replace(self, fake=fakes, labels=labels, fake_encoding="")


@dataclass
class GsAnswer:
    """Client -> server: the sanitized per-sample gradients of one query, or a refusal.

    ``grad`` is in the wire encoding ``grad_encoding`` ("" = a raw array of its own dtype).
    ``noise_multiplier`` is the Gaussian mechanism's the client ran (its ledger entry): the server
    charges the smaller of it and what it asked for. Who answered is the node the reply came from,
    never a field of the payload.
    """

    step: int
    refused: bool = False
    reason: str = ""
    grad: np.ndarray | None = None
    noise_multiplier: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    grad_encoding: str = ""
    deposited: bool = False  # secure aggregation: the answer waits on the node for the secure sum

    def decoded(self, *, batch_size: int, step: int, coords: int = 0, secure: bool = False) -> GsAnswer:
        """The answer with its gradients as float32 (None for a refusal), validated against the
        query it answers (``validate_answer``); ``coords`` > 0: gradients of that many coordinates
        per sample (``--grad-dct``) instead of pixels; ``secure``: a deposit, no gradient sent."""
        if secure and not self.refused:
            if self.step != step:
                raise PayloadError(f"answer is for step {self.step}, expected step {step}")
            if not self.deposited or self.grad is not None:
                raise PayloadError("a secure-aggregation answer is a deposit on the node, never a gradient sent")
            if not self.noise_multiplier >= 0:
                raise PayloadError(f"invalid privacy event: noise_multiplier={self.noise_multiplier}")
            return self
        grad = validate_answer(self, batch_size=batch_size, step=step, coords=coords)
        return dataclasses.replace(self, grad=grad, grad_encoding="")


def samples_per_query(batch_size: int, n_critic: int, critic_fakes: str) -> int:
    """Samples one query carries: (n_critic + 1) * B with fresh critic fakes, else the B queried."""
    return (n_critic + 1) * batch_size if critic_fakes == "fresh" else batch_size


def validate_query(
    query: GsQuery, *, n_critic: int, num_classes: int, critic_fakes: str = "fresh"
) -> tuple[np.ndarray, np.ndarray]:
    """Check a query against what the client's configuration expects.

    Returns the decoded (float32 samples, int64 labels), so that the client trains and
    differentiates at exactly the images the server encoded.
    """
    count = samples_per_query(query.batch_size, n_critic, critic_fakes)
    fakes = decode_samples(query.fake, query.fake_encoding, count=count)
    return fakes, decode_labels(query.labels, count=count, num_classes=num_classes)


def validate_answer(answer: GsAnswer, *, batch_size: int, step: int, coords: int = 0) -> np.ndarray | None:
    """Check a client's answer before the server backpropagates it through G.

    Returns the decoded float32 gradients (None for a refusal).
    """
    if answer.step != step:
        raise PayloadError(f"answer is for step {answer.step}, expected step {step}")
    if answer.refused:
        return None
    if answer.grad is None:
        raise PayloadError("answer carries no 'grad' array")
    grad = decode_grads(answer.grad, answer.grad_encoding, batch_size=batch_size, coords=coords)
    if not answer.noise_multiplier >= 0:
        raise PayloadError(f"invalid privacy event: noise_multiplier={answer.noise_multiplier}")
    return grad


MESSAGES = {MSG_QUERY: (GsQuery, GsAnswer)}
