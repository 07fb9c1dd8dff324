"""A toy release channel, from a test folder: the smallest thing the channel contract
(``common/channels/spec.py``) admits, to show that a channel is one module and one registration
and touches no method.

Releases go in the clear, each noised by the channel with twice the noise the method asks for
(std 4σ·clip per coordinate), and charged as what ran: a Gaussian with noise multiplier 2σ. A method
that lets the channel noise its clear release (``NOISE``) runs through it
unchanged; the statement, the headline's kind and rule are the channel's. It counts its releases.
DP-MERF, DP-NTK and GS-WGAN admit it; Fed-Avg GAN, whose clear release is a raw delta the server
noises, does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from common.calibration import ledger_epsilon
from common.channels import NOISE, ReleaseSpec
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.sanitizer import gaussian_noised

KIND = "per client, untrusted server, toy channel"
RULE = "toy channel: each release in the clear with noise multiplier 2σ, composed over the client's own releases"
SENTENCE = "Toy channel: every release carried twice the noise its method asked for."


class DoubledNoise:
    """In the clear, twice the spec's noise (see the module docstring)."""

    name = "toy-doubled"
    option = "release_channel"
    needs = NOISE
    sums = False
    bounds_every_release = False

    def __init__(self) -> None:
        self.noised_releases = 0

    def check_run(self, cfg: Any, spec: ReleaseSpec) -> None:
        """Nothing beyond the method's own checks."""

    def events(self, cfg: Any, spec: ReleaseSpec) -> tuple[PrivacyEvent, PrivacyEvent]:
        event = PrivacyEvent(noise_multiplier=2 * spec.noise_multiplier, sample_rate=1.0, void=spec.void)
        return event, event

    def node_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        return 2 * spec.noise_multiplier

    def revealed_noise(self, cfg: Any, spec: ReleaseSpec) -> float:
        return 0.0

    def cohort(self, cfg: Any, spec: ReleaseSpec) -> int:
        return 0

    def epsilon(self, cfg: Any, spec: ReleaseSpec, releases: int) -> float:
        return ledger_epsilon(2 * spec.noise_multiplier, 1.0, releases, cfg.delta)

    def kind(self, cfg: Any, clear_kind: str) -> str:
        return KIND

    def rule(self, cfg: Any, spec: ReleaseSpec, clear_rule: str) -> str:
        return RULE

    def sentences(self, cfg: Any, spec: ReleaseSpec, ledgers: Mapping[int, PrivacyLedger]) -> list[str]:
        return [SENTENCE]

    def session_mismatch(self, cfg: Any, session: str) -> str:
        return "a deposit asked of a clear channel" if session else ""

    def noised(self, cfg: Any, spec: ReleaseSpec, clipped: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
        self.noised_releases += 1
        return gaussian_noised(clipped, 2 * spec.std, noise)

    def admit(self, node: Any, state: Any, spec: ReleaseSpec) -> Any:
        raise TypeError("a clear release is never deposited")

    def deposit(self, *args: Any, **kwargs: Any) -> PrivacyEvent:
        raise TypeError("a clear release is never deposited")

    def server(self, cfg: Any, spec: ReleaseSpec, client_of: Callable[[int], int]) -> None:
        return None


CHANNEL = DoubledNoise()
