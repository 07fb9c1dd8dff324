"""The method contract: what a method folder gives the registry, and everything the shells ask of it.

A method is one folder, ``common/methods/<name>/``, whose ``METHOD`` satisfies ``Method`` (one test
checks every registered method against it). The shells do the Flower and wire work once for every
method: the server's (``server/strategy.py``) encodes the payloads a method's ``ServerSide`` asks
to send and decodes the replies into ``Reply`` objects; the client's (``client/app.py``) decodes a
request, checks the node's own policy, answers a refusal the one way (``refusal``) and otherwise
hands the request to ``Method.answer`` with the node as a ``ClientNode``. So a method never sees a
Flower record, and nothing here imports flwr or ``protos``.

Optional members have their defaults in ``MethodBase`` (``base.py``): a method overrides what it
needs and no shell probes a method with getattr.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from common.client_state import ClientState
from common.privacy import NodePolicy, PrivacyEvent, PrivacyLedger
from common.privacy.records import LedgerClaim
from common.secagg.requests import SumRequest, SumResult

if TYPE_CHECKING:  # types only: the registry composes the configuration from the methods
    from torch import nn

    from common.channels import ReleaseSpec
    from common.methods import ExperimentConfig


@dataclass
class PriorReleases:
    """Releases made before this run that its generator depends on: the debugging task's selection
    query (every client's noisy accuracy decided who takes part). A method that accepts them starts
    its record of each client and its own server-side ledger from these, so every report of the run
    covers them, also for clients outside the run's subset."""

    clients: dict[int, PrivacyLedger] = field(default_factory=dict)
    server: list[PrivacyEvent] = field(default_factory=list)
    description: str = ""
    # A seeded run's stage 1 (``common/methods/seeding``): what stage 2 starts from (a ``SeedStart``)
    # and stage 1's report figures, shown beside stage 2's (``stages`` in privacy.json).
    start: Any = None
    beside: PrivacyLedger | None = None  # stage 1's ledger behind the figure beside its headline (deviating server)
    stages: dict[str, Any] = field(default_factory=dict)
    # Wall seconds spent before this run on what it starts from (a seed stage's run and the server's
    # critic), so the run's reports can say what the whole thing took, not only its own loop.
    wall_s: float = 0.0


@dataclass
class StepOutcome:
    """What one round produced: whether the generator moved, metrics, and nodes to stop asking."""

    took_step: bool
    metrics: dict[str, float] = field(default_factory=dict)
    exhausted_nodes: list[int] = field(default_factory=list)
    failed_nodes: list[int] = field(default_factory=list)
    failure_reasons: dict[int, str] = field(default_factory=dict)  # node -> why it failed, where a method knows
    notes: list[str] = field(default_factory=list)
    # The step's requests go out over several rounds (DP-MERF's collection, a chunk of clients at a
    # time): this round's answers count, and the generator moves after the last round.
    more: bool = False


@dataclass
class Reply:
    """One node's reply to a step's request, as the server shell decoded it.

    ``payload`` is the method's reply dataclass, decoded and validated against what the step
    expected (``ServerSide.expectations``); None when there is none: ``lost`` (no reply: a failure
    or a timeout) or malformed, and ``problem`` says why. ``client`` is the client the node holds,
    learned at the hello (-1: a node that never identified), never what a payload claims."""

    node: int
    client: int
    payload: Any = None
    problem: str = ""
    lost: bool = False


class Refusable(Protocol):
    """Every reply payload: the step it answers, and whether (and why) the node refused it."""

    step: int
    refused: bool | None
    reason: str | None


def refusal(reply_cls: type, step: int, client_id: int, why: str) -> Any:
    """The one way every node refuses a request: nothing released, nothing charged, and a reason
    that depends only on its ledgers and the configurations, never on its data."""
    return reply_cls(step=step, refused=True, reason=f"client {client_id} refuses: {why}")


class ClientNode(Protocol):
    """The node a method's client side answers on (``client/node.py``'s ``Node``): the run's
    configuration, the node's policy and state, and its node-level ledger, charged before a reply
    leaves the node."""

    @property
    def cfg(self) -> ExperimentConfig: ...

    @property
    def client_id(self) -> int: ...

    @property
    def state_dir(self) -> str: ...

    @property
    def policy(self) -> NodePolicy: ...

    def load_state(self) -> ClientState: ...

    def record_release(self, state: ClientState, before: PrivacyLedger) -> None: ...
    def persist(self, state: ClientState) -> None: ...

    def charge(self, charges: Mapping[int, Iterable[PrivacyEvent]]) -> None: ...

    def releases_by(self, method: str) -> int: ...
    def deposit_secure_input(self, session: str, vector: Any, *, floor: int, bound: int) -> None: ...


@runtime_checkable
class ServerSide(Protocol):
    """A method's server side, wire-free: whom to ask, what to send, what the replies do, and the
    privacy report. The one round loop (``server/loop.py``) drives it through the server shell."""

    node_client: dict[int, int]
    progress_metrics: dict[str, str]  # label -> a step metric the progress bar shows when present

    def bind_nodes(self, node_client: dict[int, int]) -> None: ...

    def select_nodes(self, available: list[int]) -> list[int]: ...

    def requests(self, step: int, nodes: list[int]) -> list[tuple[int, Any]]: ...

    def expectations(self, step: int) -> dict[str, Any]: ...

    def aggregate(self, step: int, replies: list[Reply]) -> StepOutcome: ...
    def secure_sums(self, step: int) -> list[SumRequest]: ...
    def absorb_sums(self, step: int, results: list[SumResult], outcome: StepOutcome) -> None: ...

    def released_generator(self) -> nn.Module: ...

    def privacy_report(self, *, final: bool = False) -> dict[str, Any]: ...

    def ledger_nodes(self, nodes: list[int]) -> list[int]: ...

    def absorb_ledgers(self, claims: list[LedgerClaim], *, final: bool = True) -> list[str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Method(Protocol):
    """What a method is to the rest of fedgan.

    Required: ``name`` (its ``--strategy``), ``options`` (its section of the configuration, a frozen
    dataclass of ``common.options.option`` fields; may be empty), ``messages`` (message type ->
    (request, reply) payload dataclasses; every reply is ``Refusable``, every request has a
    ``step``), ``step_label`` (what one step of the loop is for it), ``validate`` (its section's
    checks), ``release_noise`` (the noise multiplier of each release a node makes, as the mechanism
    runs: what a node's minimum is checked against), ``nonprivate_options`` (its debugging options
    that void a node's guarantee), ``calibrate`` (its noise for ``--target-epsilon``), ``server``
    (its server side) and ``answer`` (its client side: one request on one node).

    ``calibrate`` composes ``prior`` (what each client released before the run: a seed release)
    with the run's releases.

    Optional, with the defaults of ``MethodBase``: ``accepts_prior_releases`` (False: it cannot account
    for releases made before its run), ``accepts_seed`` (False: it cannot start from a seed release,
    ``common/methods/seeding``; True: its server side starts from ``prior.start``, or, with
    ``pools_data``, its curator makes the seed release itself in its first round, example-level:
    ``seeding/pooled.py``), ``seeds`` (False:
    its release cannot seed a GAN; True: ``--init-release`` may name it), ``target_unit`` ("per
    client": the unit of the headline ε ``--target-epsilon`` calibrates, named in its help),
    ``unbounded_against_server`` (False: its clients add their own noise), ``supports_dpac`` (False),
    ``check_run`` (checks only when it is the run's method), ``release_spec`` and ``channel_needs``
    (None / empty: its releases take no release channel; else the spec describes one release for the
    run's channel, ``common/channels``, which then decides what a release costs and how it leaves the
    node, and ``channel_needs`` says what the method admits: ``"sums"``, a server side that takes a
    revealed sum, ``"noise"``, a clear release the channel noises; ``release_noise`` then defaults to
    its release's noise in the clear), ``min_client_images`` (batch_size images per client),
    ``client_critic_lr`` (None: its clients keep no private discriminator), ``generator_updates`` (one
    per step), ``check_sizes`` (no check against the data), ``node_ledger`` (None: the client's own
    ledger is what the node released), ``answer_many`` (one request after another), ``auditable`` and
    ``canary_score`` (False / none: ``fedgan audit`` has no white-box canary for it; else one canary
    client's releases through the method's own code, its input ``sign·magnitude`` clip bounds along one
    coordinate, and the attacker's score).
    """

    name: str
    options: type
    messages: Mapping[str, tuple[type, type]]
    step_label: str
    accepts_prior_releases: bool
    accepts_seed: bool
    pools_data: bool
    seeds: bool
    target_unit: str
    unbounded_against_server: bool
    supports_dpac: bool
    channel_needs: frozenset[str]

    def validate(self, cfg: ExperimentConfig) -> None: ...
    def check_run(self, cfg: ExperimentConfig) -> None: ...

    def release_noise(self, cfg: ExperimentConfig) -> float: ...
    def release_spec(self, cfg: ExperimentConfig, *, noise_multiplier: float | None = None) -> ReleaseSpec | None: ...

    def nonprivate_options(self, cfg: ExperimentConfig) -> list[str]: ...

    def calibrate(
        self, cfg: ExperimentConfig, *, pooled_size: int | None, prior: Sequence[PrivacyEvent] = ()
    ) -> ExperimentConfig: ...

    def server(self, cfg: ExperimentConfig, num_classes: int, prior: PriorReleases | None) -> ServerSide: ...

    def answer(self, node: ClientNode, request: Any) -> Any: ...

    def min_client_images(self, cfg: ExperimentConfig) -> int: ...

    def client_critic_lr(self, cfg: ExperimentConfig) -> float | None: ...

    def generator_updates(self, cfg: ExperimentConfig, steps: int) -> int: ...

    def check_sizes(self, cfg: ExperimentConfig, sizes: list[int]) -> None: ...

    def schedule_notes(self, cfg: ExperimentConfig) -> list[str]: ...

    def node_ledger(self, cfg: ExperimentConfig, client_id: int, state_dir: str) -> PrivacyLedger | None: ...

    def answer_many(self, nodes: list[ClientNode], requests: list[Any]) -> list[Any]: ...

    auditable: bool

    def canary_score(
        self, state: ClientState, cfg: ExperimentConfig, sign: int, magnitude: float, releases: int, policy: NodePolicy
    ) -> float: ...
