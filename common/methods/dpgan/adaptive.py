"""DPGAN's adaptive discriminator step frequency (Bie, Kamath, Zhang 2023, §6.2): it watches D's
accuracy on fakes only, so it costs no privacy."""

from __future__ import annotations

import math


def next_n_d(n_d: int) -> int:
    """The next of 1, 2, 5, 10, 20, 50, 100, ... (Bie et al. §6.2)."""
    if n_d < 1:
        raise ValueError(f"n_D must be >= 1, got {n_d}")
    power = 10 ** int(math.floor(math.log10(n_d) + 1e-9))
    for mantissa in (1, 2, 5, 10):
        if mantissa * power > n_d:
            return mantissa * power
    raise AssertionError("unreachable")


class AdaptiveND:
    """Adaptive n_D: EMA (β) of D's accuracy on fakes, seen once per generator step; when it is
    below ``threshold`` d and the grace period 2/(1-β) since the last change has passed, move to the
    next n_D. Uses fake samples only, so it costs no privacy (accuracy on reals would)."""

    def __init__(self, *, threshold: float, beta: float = 0.99, initial_n_d: int = 1) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.threshold, self.beta = float(threshold), float(beta)
        # β-EMA is mostly determined by its last 2/(1-β) observations (the paper's reason).
        self.grace_steps = round(2 / (1 - beta))
        self.n_d = int(initial_n_d)
        self.ema: float | None = None
        self.steps_since_change = 0

    def update(self, fake_accuracy: float) -> int:
        """Fold in one generator step's fake accuracy; returns the n_D to use next."""
        a = float(fake_accuracy)
        self.ema = a if self.ema is None else self.beta * self.ema + (1 - self.beta) * a
        self.steps_since_change += 1
        if self.steps_since_change >= self.grace_steps and self.ema < self.threshold:
            self.n_d = next_n_d(self.n_d)
            self.steps_since_change = 0
        return self.n_d

    def state_dict(self) -> dict:
        return {"n_d": self.n_d, "ema": self.ema, "steps_since_change": self.steps_since_change}

    def load_state_dict(self, state: dict) -> None:
        self.n_d = int(state["n_d"])
        self.ema = None if state["ema"] is None else float(state["ema"])
        self.steps_since_change = int(state["steps_since_change"])
