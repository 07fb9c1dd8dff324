"""``--target-epsilon``: choose a method's noise so that its headline ε reaches the target.

Calibration happens once, before any work (``prepare`` in the registry), and its result is written
into the resolved config (``config.json``), so a run, its resume and its report agree on the σ that
was used. The reported ε still comes from the ledgers of what ran; calibration only picks the noise.
Each method says how (its ``calibrate``); the helpers it uses are here.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Literal

from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.analysis import check_delta


@functools.lru_cache(maxsize=4096)
def ledger_epsilon(noise_multiplier: float, sample_rate: float, count: int, delta: float) -> float:
    """ε of ``count`` Gaussian releases (Poisson-subsampled at ``sample_rate`` < 1), from a ledger.

    Memoized (a pure function of four numbers): ``fedgan compare`` checks every method's calibration
    before training any, then calibrates again as each run starts, and a subsampled curve costs
    seconds to evaluate."""
    sampling = "poisson" if sample_rate < 1 else "none"
    ledger = PrivacyLedger(
        [PrivacyEvent(noise_multiplier=noise_multiplier, sample_rate=sample_rate, count=count, sampling=sampling)]
    )
    return ledger.epsilon(delta=delta)


def smallest_noise(
    epsilon_of: Callable[[float], float], target: float, *, low: float = 1e-3, high: float = 1e4, rel: float = 1e-4
) -> float:
    """Smallest noise multiplier whose ε (a decreasing function) is ≤ target, by bisection.

    The search probes tiny noise multipliers whose optimal RDP order is the grid's largest, and
    Opacus warns about each; those probes only bracket the answer, so the warnings are silenced here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        if epsilon_of(high) > target:
            raise ValueError(f"target ε={target} is out of reach even with noise multiplier {high}")
        while high - low > rel * high:
            mid = math.sqrt(low * high)
            low, high = (low, mid) if epsilon_of(mid) <= target else (mid, high)
    return high


@functools.lru_cache(maxsize=256)
def subsampled_noise(target: float, sample_rate: float, steps: int, delta: float) -> float:
    """Opacus' get_noise_multiplier, nudged up until the ledger's own RDP grid agrees (≤ target).

    The subsampled RDP curve is costly to evaluate at many σ; Opacus' search lands within a hair of
    the answer, and its order grid differs slightly from the ledger's, hence the nudge. Opacus'
    search keeps the upper end of its bracket, so the σ never overshoots. Memoized, as
    ``ledger_epsilon``.
    """
    sigma = calibrate_noise_multiplier(target_epsilon=target, sample_rate=sample_rate, steps=steps, delta=delta)
    while ledger_epsilon(sigma, sample_rate, steps, delta) > target:
        sigma *= 1.002
    return sigma


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Literal["rdp", "prv"] = "rdp",
) -> float:
    """Smallest σ (to Opacus' bisection tolerance) whose ε after ``steps`` is ≤ the target.

    Opacus' search keeps the upper end of its bracket, so the returned σ never overshoots.
    """
    check_delta(delta)
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
            )
        )
