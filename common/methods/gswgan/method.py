"""GS-WGAN as the shells see it (``common/methods/protocol.py``'s ``Method``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.channels import NOISE, SUMS, ReleaseSpec, channel_for

from ..base import MethodBase, or_error
from ..protocol import ClientNode, PriorReleases, refusal
from . import canary, options, privacy
from .client import answer_queries, answer_query
from .deposit import deposit_answer
from .messages import MESSAGES, GsAnswer, GsQuery
from .server import GsWganServer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from common.client_state import ClientState
    from common.methods import ExperimentConfig
    from common.privacy import NodePolicy, PrivacyEvent


class GsWgan(MethodBase):
    name = "gswgan"
    options = options.Options
    messages = MESSAGES
    step_label = "generator steps"
    accepts_prior_releases = True  # it reports releases made before the run (the debugging task)
    accepts_seed = True  # its G starts from a seed release's (``common/methods/seeding``)
    supports_dpac = True  # federated DPAC: C_k beside D_k on each client, one sanitized combined gradient

    auditable = True
    channel_needs = frozenset({SUMS, NOISE})  # the step's m answers to one fake batch can be summed; its rows noised

    def canary_score(
        self, state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
    ) -> float:
        """``fedgan audit``'s canary through this method's own release code (``canary.py``)."""
        return canary.canary_score(state, cfg, sign, magnitude, releases, policy)

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)

    def release_spec(self, cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec:
        return privacy.release_spec(cfg, noise_multiplier=noise_multiplier)

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]:
        return privacy.nonprivate_options(cfg)

    def calibrate(
        self, cfg: ExperimentConfig, *, pooled_size: int | None, prior: Sequence[PrivacyEvent] = ()
    ) -> ExperimentConfig:
        return privacy.calibrate(cfg, pooled_size=pooled_size, prior=prior)

    def schedule_notes(self, cfg: ExperimentConfig) -> list[str]:
        return [note] if (note := privacy.unspent_answers_note(cfg)) else []

    def client_critic_lr(self, cfg: ExperimentConfig) -> float | None:
        """Every client keeps its private D_k (and its Adam) across the run."""
        return cfg.lr_d

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> GsWganServer:
        return GsWganServer(cfg, num_classes, prior)

    def answer(self, node: ClientNode, request: GsQuery) -> GsAnswer:
        """Answer one query on this node's client state; the release is charged to the node's ledger
        and the state written before the reply leaves."""
        state, channel = node.load_state(), channel_for(node.cfg)
        why = channel.session_mismatch(node.cfg, request.session)
        if why:
            return refusal(GsAnswer, request.step, state.client_id, why)
        if channel.sums:
            return deposit_answer(node, state, request)  # charged and persisted inside
        before = state.ledger.copy()
        answer = answer_query(state, node.cfg, request, node.policy)
        if not answer.refused:
            node.record_release(state, before)
        return answer

    def answer_many(self, nodes: list[ClientNode], requests: list[GsQuery]) -> list[Any]:
        """One step's queries to several nodes of this process: answered together by
        ``answer_queries`` (their critic phases stacked) when they run one configuration that
        allows it, else one by one; then each node records its own release. A node whose own state
        or data breaks its answer fails alone; an error outside any one client fails every node of
        the stacked phase, with its cause."""
        cfgs = [node.cfg for node in nodes]
        if any(channel_for(cfg).sums for cfg in cfgs):  # each deposits on its own node: one by one
            return super().answer_many(nodes, requests)
        states = [or_error(node.load_state) for node in nodes]
        ok = [i for i, state in enumerate(states) if not isinstance(state, Exception)]
        if len(ok) < 2 or not cfgs[ok[0]].stack_clients or any(cfgs[i] != cfgs[ok[0]] for i in ok):
            return super().answer_many(nodes, requests)
        before = {i: states[i].ledger.copy() for i in ok}
        try:
            answers = answer_queries(
                [states[i] for i in ok], cfgs[ok[0]], [requests[i] for i in ok], [nodes[i].policy for i in ok]
            )
        except Exception as err:  # noqa: BLE001 - every node of the stacked phase fails with its cause
            answers = [err] * len(ok)
        out: list[Any] = list(states)  # the errors of the nodes whose state could not be read
        for i, answer in zip(ok, answers, strict=True):
            out[i] = _recorded(nodes[i], states[i], before[i], answer)
        return out


def _recorded(node: ClientNode, state: Any, before: Any, answer: GsAnswer | Exception) -> GsAnswer | Exception:
    """``answer`` once its release is charged and its state written, or the error that failed it."""
    if isinstance(answer, Exception):
        return answer
    try:
        if not answer.refused:
            node.record_release(state, before)
    except Exception as err:  # noqa: BLE001 - this node fails, the others go on
        return err
    return answer


METHOD = GsWgan()
