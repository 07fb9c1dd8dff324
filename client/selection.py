"""On-device selection statistic for the debugging task (Augenstein et al. 2020).

The server ships a classifier; each client measures its accuracy on its own data and releases it
through a Gaussian mechanism. Replacing one example changes the accuracy by at most 1/n, so noise
std ``noise_multiplier / n`` is a Gaussian mechanism with that noise multiplier; it is recorded in
the client's ledger like every other release, so the ε a client reports covers the selection too.
"""

from __future__ import annotations

import torch

from common.config import ExperimentConfig
from common.evaluation.classifier import DomainClassifier, accuracy
from common.privacy import PrivacyEvent

from .discriminator import query_noise_source
from .state import ClientState

SELECTION_STEP = -1  # noise stream id of the selection query (the GS-WGAN steps are >= 0)


def noisy_accuracy(state: ClientState, cfg: ExperimentConfig, classifier_state: dict[str, torch.Tensor],
                   *, num_classes: int, noise_multiplier: float) -> tuple[float | None, str]:
    """The classifier's accuracy on this client's data plus N(0, (σ_sel/n)²), or a refusal reason."""
    event = PrivacyEvent(noise_multiplier=noise_multiplier, sample_rate=1.0)
    if state.ledger.would_exceed(budget=cfg.client_epsilon_budget, delta=cfg.delta, next_event=event):
        return None, f"client {state.client_id} refuses: the selection query would exceed its budget"
    model = DomainClassifier(num_classes)
    model.load_state_dict(classifier_state)
    model.eval()
    n = len(state.data.labels)
    acc = accuracy(model, state.data.images, state.data.labels)
    noise = torch.randn((), generator=query_noise_source(cfg, state.client_id, SELECTION_STEP)).item()
    state.ledger.record(event)
    state.version += 1
    return acc + noise * noise_multiplier / n, ""
