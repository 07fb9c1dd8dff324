"""The debugging task's selection release is per client: noise std σ_sel on an accuracy of
client-level sensitivity 1, whatever the client's (private) number of examples."""

import pytest
import torch

from common.client_state import new_state
from common.evaluation.classifier import DomainClassifier, accuracy
from common.evaluation.selection import SELECTION_STEP, noisy_accuracy
from common.privacy import NodePolicy, PrivacyEvent
from common.privacy.events import VOID_NOISE_SEED
from common.privacy.sanitizer import release_noise_source
from tests.helpers import tiny_cfg


@pytest.mark.parametrize("examples", [40, 120])
def test_selection_noise_is_sigma_whatever_the_clients_size(examples):
    """Audit: the noise was σ_sel/n (example level) while the ledger charged σ_sel per client, so
    a printed ε 4.73 was ~7,800 at client level for n = 120; the noise scale also revealed n."""
    cfg = tiny_cfg(noise_seed=3, synthetic_samples_per_writer=examples)
    state = new_state(cfg, 1)
    classifier = DomainClassifier(10)
    value, reason = noisy_accuracy(
        state,
        cfg,
        classifier.state_dict(),
        num_classes=10,
        noise_multiplier=0.2,
        policy=NodePolicy(allow_nonprivate=True),
    )
    assert reason == ""
    clean = accuracy(classifier.eval(), state.data.images, state.data.labels)
    draw = torch.randn((), generator=release_noise_source(3, 1, SELECTION_STEP)[0]).item()
    assert value == pytest.approx(clean + 0.2 * draw, abs=1e-9)
    assert state.ledger.history == (PrivacyEvent(noise_multiplier=0.2, void=VOID_NOISE_SEED),)
