"""The debugging task's on-device release (Augenstein et al. 2020): a classifier's noisy accuracy.

The server ships a classifier; each client measures its accuracy on its own data and releases it
through a Gaussian mechanism. The unit is the client's whole data set, as for every per-client
figure: replacing it moves the accuracy by up to 1, so the noise std is ``noise_multiplier`` itself
(sensitivity 1), never divided by the client's n. (An earlier version added std σ/n, an
example-level release charged as a per-client one: at n = 120 its printed ε 4.73 was about 7,800
at client level, and the noise scale revealed the private n.) The release is recorded in the
client's ledger like every other, so the ε a client reports covers the selection too.
"""

from __future__ import annotations

import torch

from common.client_state import ClientState
from common.evaluation.classifier import DomainClassifier, accuracy
from common.privacy import NodePolicy, PrivacyEvent
from common.privacy.sanitizer import release_noise_source
from common.run_options import RunOptions

SELECTION_STEP = -1  # noise stream id of the selection query (the GS-WGAN steps are >= 0)
SENSITIVITY = 1.0  # an accuracy in [0, 1]: replacing the client's whole data set moves it by up to 1


def noisy_accuracy(
    state: ClientState,
    cfg: RunOptions,
    classifier_state: dict[str, torch.Tensor],
    *,
    num_classes: int,
    noise_multiplier: float,
    policy: NodePolicy | None = None,
) -> tuple[float | None, str]:
    """The classifier's accuracy on this client's data plus N(0, σ_sel²), or a refusal reason.

    The server chooses σ_sel per query, so the node checks it against its own policy here."""
    policy = policy or NodePolicy()
    noise, void = release_noise_source(cfg.noise_seed, state.client_id, SELECTION_STEP)
    event = PrivacyEvent(noise_multiplier=noise_multiplier, sample_rate=1.0, void=void)
    problem = policy.release_refusal(state.ledger, event, cfg, "the selection query")
    if problem:
        return None, f"client {state.client_id} refuses: {problem}"
    model = DomainClassifier(num_classes)
    model.load_state_dict(classifier_state)
    model.eval()
    acc = accuracy(model, state.data.images, state.data.labels)
    draw = torch.randn((), generator=noise).item()
    state.ledger.record(event)
    state.version += 1
    return acc + draw * noise_multiplier * SENSITIVITY, ""
