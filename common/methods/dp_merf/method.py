"""DP-MERF as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import MethodBase
from ..protocol import ClientNode, PriorReleases, refusal
from ..secure_sums import session_mismatch
from . import canary, options, privacy
from .client import release, released_before, secure_release
from .messages import MESSAGES, MerfRelease, MerfRequest
from .server import DpMerfServer

if TYPE_CHECKING:
    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import NodePolicy


class DpMerf(MethodBase):
    name = "dp-merf"
    options = options.Options
    messages = MESSAGES
    step_label = "generator steps"

    auditable = True
    supports_secure_aggregation = True

    def canary_score(
        self, state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
    ) -> float:
        """``fedgan audit``'s canary through this method's own release code (``canary.py``)."""
        return canary.canary_score(state, cfg, sign, magnitude, releases, policy)

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def check_run(self, cfg: ExperimentConfig) -> None:
        options.check_run(cfg)

    def release_noise(self, cfg: ExperimentConfig) -> float:
        return privacy.release_noise(cfg)

    def protocol_release_noise(self, cfg: ExperimentConfig) -> float:
        return cfg.merf_noise_multiplier if cfg.secure_aggregation else 0.0

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(self, cfg: ExperimentConfig, *, pooled_size: int | None) -> ExperimentConfig:
        return privacy.calibrate(cfg, pooled_size=pooled_size)

    def min_client_images(self, cfg: ExperimentConfig) -> int:
        """A client draws no batches: one image makes a summary."""
        return 1

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> DpMerfServer:
        return DpMerfServer(cfg, num_classes)

    def answer(self, node: ClientNode, request: MerfRequest) -> MerfRelease:
        """This node's summary, once (a second release needs a budget of the node's own); charged to
        the node's ledger and the state written before the reply leaves."""
        state = node.load_state()
        before = state.ledger.copy()
        again = released_before(node.releases_by(self.name), node.policy)
        if again:
            return refusal(MerfRelease, request.step, state.client_id, again)
        why = session_mismatch(node.cfg, request.session)
        if why:
            return refusal(MerfRelease, request.step, state.client_id, why)
        if request.session:
            return secure_release(node, state, request)  # charged and persisted inside
        reply = release(state, node.cfg, request, node.policy)
        if not reply.refused:
            node.record_release(state, before)
        return reply


METHOD = DpMerf()
