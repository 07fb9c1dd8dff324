"""Centralized DPGAN as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.privacy import PrivacyLedger

from ..base import MethodBase
from ..protocol import ClientNode, PriorReleases
from . import options, privacy
from .client import answer_round
from .curator import CURATOR
from .messages import MESSAGES, DpganReply, DpganRound
from .server import DpganServer
from .storage import load_ledger

if TYPE_CHECKING:
    from collections.abc import Sequence

    from common.methods import ExperimentConfig
    from common.privacy import PrivacyEvent


class Dpgan(MethodBase):
    name = "dpgan"
    target_unit = "per example (one curator's DP-SGD)"
    options = options.Options
    messages = MESSAGES
    step_label = "generator steps"
    supports_dpac = True  # centralized DPAC: C trained with DP-SGD on the curator, charged like D's steps
    accepts_seed = True  # its curator makes the seed release itself, example-level (``seeding/pooled.py``)
    pools_data = True

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def release_noise(self, cfg: ExperimentConfig) -> float:
        return privacy.release_noise(cfg)

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(
        self, cfg: ExperimentConfig, *, pooled_size: int | None, prior: Sequence[PrivacyEvent] = ()
    ) -> ExperimentConfig:
        return privacy.calibrate(cfg, pooled_size=pooled_size, prior=prior)

    def schedule_notes(self, cfg: ExperimentConfig) -> list[str]:
        return [note] if (note := privacy.seed_round_note(cfg)) else []

    def check_sizes(self, cfg: ExperimentConfig, sizes: list[int]) -> None:
        privacy.check_sizes(cfg, sizes)

    def node_ledger(self, cfg: ExperimentConfig, client_id: int, state_dir: str) -> PrivacyLedger | None:
        """What the curator released in ``state_dir`` (its DP steps); nothing for any other node."""
        return load_ledger(state_dir) if client_id == CURATOR else PrivacyLedger()

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> DpganServer:
        return DpganServer(cfg, num_classes)  # a seed is its curator's (``seeding/pooled.py``): no prior

    def answer(self, node: ClientNode, request: DpganRound) -> DpganReply:
        return answer_round(node, request)


METHOD = Dpgan()
