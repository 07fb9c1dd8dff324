"""Communication counters: bytes per direction, per client, per step, from what was serialized."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommCounter:
    """Accumulates bytes of messages that crossed between server and clients.

    ``down`` is server -> client, ``up`` client -> server; ``*_envelope`` is the part of each total
    that is message metadata and object tree rather than payload objects. CT (the GS-WGAN paper's
    communication cost) is bytes per generator step averaged over participating clients.
    """

    down: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    up: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    down_envelope: int = 0
    up_envelope: int = 0
    participations: int = 0
    control_down: int = 0
    control_up: int = 0

    def add_down(self, client: int, total: int, envelope: int) -> None:
        self.down[client] += total
        self.down_envelope += envelope

    def add_up(self, client: int, total: int, envelope: int) -> None:
        self.up[client] += total
        self.up_envelope += envelope

    def add_control(self, down: int, up: int) -> None:
        """Messages outside the generator steps (ledger queries at the end)."""
        self.control_down += down
        self.control_up += up

    def count_participation(self, n: int = 1) -> None:
        self.participations += n

    @property
    def down_total(self) -> int:
        return sum(self.down.values())

    @property
    def up_total(self) -> int:
        return sum(self.up.values())

    def per_step(self) -> dict[str, float]:
        """Bytes per generator step per participating client (CT), each direction and both."""
        n = max(self.participations, 1)
        down, up = self.down_total / n, self.up_total / n
        return {"down": down, "up": up, "total": down + up}

    def summary(self) -> dict[str, Any]:
        return {
            "bytes_per_step": self.per_step(),
            "bytes_down_total": self.down_total,
            "bytes_up_total": self.up_total,
            "envelope_bytes_down_total": self.down_envelope,
            "envelope_bytes_up_total": self.up_envelope,
            "control_bytes_down_total": self.control_down,
            "control_bytes_up_total": self.control_up,
            "participations": self.participations,
            "definition": "serialized Flower message bytes (payload objects + metadata + object "
            "tree, as Flower 1.41's runtime sends them; HTTP framing excluded), per generator "
            "step averaged over participating clients",
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "down": dict(self.down),
            "up": dict(self.up),
            "down_envelope": self.down_envelope,
            "up_envelope": self.up_envelope,
            "participations": self.participations,
            "control_down": self.control_down,
            "control_up": self.control_up,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CommCounter:
        counter = cls()
        counter.down.update({int(k): v for k, v in state["down"].items()})
        counter.up.update({int(k): v for k, v in state["up"].items()})
        for key in ("down_envelope", "up_envelope", "participations", "control_down", "control_up"):
            setattr(counter, key, int(state[key]))
        return counter
