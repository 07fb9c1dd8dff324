"""The local channel (the default): each client's release leaves its node in the clear, carrying the
method's own mechanism: a Gaussian the client adds (DP-MERF's summary, GS-WGAN's per-sample
gradients) or none (Fed-Avg's raw delta, which the server noises). Each release is charged as the
method describes it (``ReleaseSpec.clear_event``), composed over the client's own releases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from common.calibration import ledger_epsilon
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.sanitizer import gaussian_noised

from .spec import ReleaseSpec

if TYPE_CHECKING:
    import torch


class LocalChannel:
    """Releases in the clear, each with its client's own noise (see the module docstring)."""

    name = "local"
    option = "release_channel"
    needs = ""  # every method's own release is the local one
    sums = False
    bounds_every_release = False  # a raw delta sent in the clear is not

    def check_run(self, cfg: Any, spec: ReleaseSpec) -> None:
        """Nothing beyond the method's own checks."""

    def events(self, cfg: Any, spec: ReleaseSpec) -> tuple[PrivacyEvent, PrivacyEvent]:
        return spec.clear_event, spec.clear_event

    def node_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        return spec.clear_event.noise_multiplier

    def revealed_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        return 0.0  # nothing is revealed beyond the releases themselves

    def cohort(self, cfg: Any, spec: ReleaseSpec) -> int:
        return 0  # no sum

    def epsilon(self, cfg: Any, spec: ReleaseSpec, releases: int) -> float:
        """The per-client ε of ``releases`` Gaussian releases at the spec's multiplier."""
        return ledger_epsilon(spec.noise_multiplier, 1.0, releases, cfg.delta)

    def kind(self, cfg: Any, clear_kind: str) -> str:
        return clear_kind

    def rule(self, cfg: Any, spec: ReleaseSpec, clear_rule: str) -> str:
        return clear_rule

    def sentences(self, cfg: Any, spec: ReleaseSpec, ledgers: Mapping[int, PrivacyLedger]) -> list[str]:
        return []

    def session_mismatch(self, cfg: Any, session: str) -> str:
        """Why a node refuses a request with a secure-sum session (""): a deposit the run never sums."""
        return (
            "the request asks for a deposit for a secure sum, but the run's releases go in the clear" if session else ""
        )

    def noised(self, cfg: Any, spec: ReleaseSpec, clipped: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
        """``clipped`` plus the Gaussian the spec asks for: std 2σ·clip per coordinate (replace-one
        sensitivity 2·clip), drawn from the client's own ``noise``."""
        return gaussian_noised(clipped, spec.std, noise)

    def admit(self, node: Any, state: Any, spec: ReleaseSpec) -> Any:
        raise TypeError("a local release is sent, never deposited")

    def deposit(self, *args: Any, **kwargs: Any) -> PrivacyEvent:
        raise TypeError("a local release is sent, never deposited")

    def server(self, cfg: Any, spec: ReleaseSpec, client_of: Callable[[int], int]) -> None:
        return None  # the method's server side takes each release as it comes
