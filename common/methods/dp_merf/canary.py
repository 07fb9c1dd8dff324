"""DP-MERF's canary for ``fedgan audit``: a client whose summary is crafted, released by ``release``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from common.data import num_classes_for
from common.privacy import NodePolicy

from .client import release
from .messages import MerfRequest

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig

    from .features import FeatureFamily


def canary_score(
    state: ClientState,
    cfg: ExperimentConfig,
    sign: int,
    magnitude: float,
    releases: int,
    policy: NodePolicy,
    family: FeatureFamily,
) -> float:
    """The canary asked ``releases`` times (its budget may refuse): its summary is ``sign·magnitude·S``
    on the first coordinate of the summary's shape; the attacker's score sums that coordinate of
    every release."""
    summary = torch.zeros(num_classes_for(cfg), family.row_dim(cfg))
    summary[0, 0] = sign * magnitude * cfg.merf_clip
    score = 0.0
    for step in range(releases):
        reply = release(state, cfg, MerfRequest(step=step), policy, family=family, summary=summary)
        if reply.refused:
            break
        score += float(reply.embedding[0, 0])
    return score
