"""DP-MERF as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from common.channels import NOISE, SUMS, ReleaseSpec, channel_for

from ..base import MethodBase
from ..protocol import ClientNode, PriorReleases, refusal
from . import canary, options, privacy
from .client import deposit_release, release, released_before
from .features import RANDOM_FOURIER, FeatureFamily
from .messages import MSG_EMBED, MerfRelease, MerfRequest
from .server import DpMerfServer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import NodePolicy, PrivacyEvent


class DpMerf(MethodBase):
    """A one-shot release: DP-MERF's, and (subclassed with another ``family``, name, options and
    message) every method that releases one noisy labelled mean embedding per client."""

    name = "dp-merf"
    options = options.Options
    messages = {MSG_EMBED: (MerfRequest, MerfRelease)}
    step_label = "generator steps"
    family: FeatureFamily = RANDOM_FOURIER
    seeds = True  # a generator fitted to its one release seeds a GAN (``common/methods/seeding``)
    title = "DP-MERF"  # as the privacy statement names the method
    # Every one-shot method's name: a node's releases under any of them count together (a summary
    # of the same data under another feature map composes like a second release of this one).
    one_shot_names: ClassVar[list[str]] = ["dp-merf"]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        DpMerf.one_shot_names.append(cls.name)

    auditable = True
    # its server side takes a revealed sum; its clear release is noised by the channel
    channel_needs = frozenset({SUMS, NOISE})

    def canary_score(
        self, state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
    ) -> float:
        """``fedgan audit``'s canary through this method's own release code (``canary.py``)."""
        return canary.canary_score(state, cfg, sign, magnitude, releases, policy, self.family)

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def release_spec(self, cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec:
        return privacy.release_spec(cfg, self.family, noise_multiplier=noise_multiplier)

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(
        self, cfg: ExperimentConfig, *, pooled_size: int | None, prior: Sequence[PrivacyEvent] = ()
    ) -> ExperimentConfig:
        return privacy.calibrate(cfg, self.family, pooled_size=pooled_size, prior=prior)

    def schedule_notes(self, cfg: ExperimentConfig) -> list[str]:
        return [note] if (note := privacy.cohort_noise_note(cfg, self.family)) else []

    def min_client_images(self, cfg: ExperimentConfig) -> int:
        """A client draws no batches: one image makes a summary."""
        return 1

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> DpMerfServer:
        return DpMerfServer(cfg, num_classes, self.family, self.title)

    def answer(self, node: ClientNode, request: MerfRequest) -> MerfRelease:
        """This node's summary, once (a second release needs a budget of the node's own); charged to
        the node's ledger and the state written before the reply leaves."""
        state = node.load_state()
        before = state.ledger.copy()
        again = released_before(sum(node.releases_by(name) for name in DpMerf.one_shot_names), node.policy)
        if again:
            return refusal(MerfRelease, request.step, state.client_id, again)
        channel = channel_for(node.cfg)
        why = channel.session_mismatch(node.cfg, request.session)
        if why:
            return refusal(MerfRelease, request.step, state.client_id, why)
        if channel.sums:
            return deposit_release(node, state, request, self.family)  # charged and persisted inside
        reply = release(state, node.cfg, request, node.policy, family=self.family)
        if not reply.refused:
            node.record_release(state, before)
        return reply


METHOD = DpMerf()
