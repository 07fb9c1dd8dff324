"""The release-channel contract: what a method says of one release (``ReleaseSpec``), and what a
channel does with it (``ReleaseChannel``), for the methods and the registry to share.

The model is TensorFlow Federated's aggregation factories (``tff.aggregators``): the learning process
never knows how its sum is made. Here a method describes its release once, as a vector: its length,
the L2 bound it is clipped to, the noise multiplier the released (or revealed) value must carry, the
clients one step sums, and what one release costs in the clear under the method's own mechanism. The
channel turns that into the events every ledger records, the noise a node's policy is checked
against, the calibration's ε, the headline's kind and rule, the statement's sentences, the client's
side of a release and the server's records. Adding a channel touches no method.

A method states what its release admits (``Method.channel_needs``, checked at the boundary): a
summing channel needs ``"sums"`` (its server side takes a revealed sum through ``absorb_sums``), a
clear channel that noises in place of the method's own mechanism needs ``"noise"`` (its client
side noises through ``ReleaseChannel.noised``). The local channel needs nothing: every method's own
release is the local one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from common.privacy import PrivacyEvent, PrivacyLedger

if TYPE_CHECKING:
    import torch

    from common.client_state import ClientState
    from common.privacy import NodePolicy

SUMS = "sums"  # a method whose server side takes a revealed sum (``absorb_sums``) instead of each release
NOISE = "noise"  # a method whose clear release is noised by the channel (``ReleaseChannel.noised``)


@dataclass(frozen=True)
class ReleaseSpec:
    """One client's release, as a method describes it to its channel.

    ``dim`` coordinates clipped to L2 norm ``clip`` (replace-one sensitivity 2·clip); the released
    value, or the revealed sum through a summing channel, carries ``noise_multiplier`` in the
    Gaussian's units (std 2·noise_multiplier·clip); ``cohort`` clients are asked per step (the
    clients one sum holds), set by the option ``cohort_field``; ``noise_field`` is the option that
    holds the noise (errors name both). ``clear_event`` is one release in the clear as the method's
    own mechanism runs it (a Gaussian, or a raw delta the server noises); ``void`` why a release in
    this run is not private (a debugging option its nodes allowed). ``what`` names one release in
    refusals and statements ("summary", "answer", "delta"); ``describes`` says what it is, for the
    channel's rule ("its labelled mean embedding, once, clipped to S"). ``noise_std``: the std per
    coordinate of the Gaussian the local channel adds, as the method defines it (2σS; GS-WGAN's
    per-sample rows 2σC, the same as 2·(σ/√B)·(C√B) but computed as its own mechanism always was);
    None: 2·noise_multiplier·clip."""

    what: str
    describes: str
    dim: int
    clip: float
    noise_multiplier: float
    cohort: int
    cohort_field: str
    noise_field: str
    clear_event: PrivacyEvent
    void: str = ""
    noise_std: float | None = None

    @property
    def std(self) -> float:
        """The local Gaussian's std per coordinate (``noise_std``, or 2·noise_multiplier·clip)."""
        return 2.0 * self.noise_multiplier * self.clip if self.noise_std is None else self.noise_std


class Outcome(Protocol):
    """The step outcome a channel's server part writes its notes and failures into
    (``common/methods/protocol.py``'s ``StepOutcome``)."""

    took_step: bool
    failed_nodes: list[int]
    failure_reasons: dict[int, str]
    notes: list[str]


class DepositingNode(Protocol):
    """The node a summing channel deposits a client's release on (``client/node.py``'s ``Node``)."""

    @property
    def cfg(self) -> Any: ...

    @property
    def policy(self) -> NodePolicy: ...

    def charge(self, charges: Mapping[int, Any]) -> None: ...
    def persist(self, state: ClientState) -> None: ...
    def deposit_secure_input(self, session: str, vector: Any, *, floor: int, bound: int) -> None: ...


@runtime_checkable
class ReleaseChannel(Protocol):
    """How a release leaves a client and what it costs: one object per channel, stateless (the
    per-run server records come from ``server``).

    ``name`` picks it (``--release-channel``), ``option`` is the option an error about it names,
    ``needs`` what a method must admit to use it ("" / ``SUMS`` / ``NOISE``), ``sums`` whether its
    server side receives a revealed sum instead of each release, ``bounds_every_release`` whether a
    release through it is bounded against the server whatever the method's own mechanism (a raw delta
    deposited with a noise share is; sent in the clear it is not)."""

    name: str
    option: str
    needs: str
    sums: bool
    bounds_every_release: bool

    def check_run(self, cfg: Any, spec: ReleaseSpec) -> None: ...

    def events(self, cfg: Any, spec: ReleaseSpec) -> tuple[PrivacyEvent, PrivacyEvent]: ...

    def node_noise(self, cfg: Any, spec: ReleaseSpec) -> float: ...

    def revealed_noise(self, cfg: Any, spec: ReleaseSpec) -> float: ...

    def cohort(self, cfg: Any, spec: ReleaseSpec) -> int: ...

    def epsilon(self, cfg: Any, spec: ReleaseSpec, releases: int) -> float: ...

    def kind(self, cfg: Any, clear_kind: str) -> str: ...

    def rule(self, cfg: Any, spec: ReleaseSpec, clear_rule: str) -> str: ...

    def sentences(self, cfg: Any, spec: ReleaseSpec, ledgers: Mapping[int, PrivacyLedger]) -> list[str]: ...

    def session_mismatch(self, cfg: Any, session: str) -> str: ...

    def noised(self, cfg: Any, spec: ReleaseSpec, clipped: torch.Tensor, noise: torch.Generator) -> torch.Tensor: ...

    def deposit(
        self, node: DepositingNode, state: ClientState, session: str, step: int, spec: ReleaseSpec, vector_of: Callable
    ) -> str: ...

    def server(self, cfg: Any, spec: ReleaseSpec, client_of: Callable[[int], int]) -> Any: ...
