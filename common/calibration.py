"""``--target-epsilon``: choose each strategy's noise so that its headline ε reaches the target.

Calibration happens once, before any work, and its result is written into the resolved config
(``config.json``), so a run, its resume and its report agree on the σ that was used. The reported ε
still comes from the ledgers of what ran; calibration only picks the noise.

- gswgan: per-client ε (untrusted server) of a client answering its expected share
  ceil(T·m/K) of queries equals the target; clients also get ``client_epsilon_budget = target``, so
  one sampled more often than expected refuses instead of exceeding it.
- dpgan: example-level ε of steps × n_D Poisson-subsampled DP-SGD steps (q = B/N); the curator also
  gets ``client_epsilon_budget = target``, so an adaptive n_D that grows past the planned steps
  stops the run at the target instead of overshooting it.
- fedavg-gan: the user-level, trusted-server ε of the rounds (Poisson, q = m/K); per-client ε
  against the server stays unbounded whatever the noise, which the report says.
"""

from __future__ import annotations

import math

from common.config import ExperimentConfig
from common.privacy import PrivacyEvent, PrivacyLedger


def _ledger_epsilon(noise_multiplier: float, sample_rate: float, count: int, delta: float) -> float:
    sampling = "poisson" if sample_rate < 1 else "none"
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                         count=count, sampling=sampling)])
    return ledger.epsilon(delta=delta)


def smallest_noise(epsilon_of, target: float, *, low: float = 1e-3, high: float = 1e4, rel: float = 1e-4) -> float:
    """Smallest noise multiplier whose ε (a decreasing function) is ≤ target, by bisection."""
    if epsilon_of(high) > target:
        raise ValueError(f"target ε={target} is out of reach even with noise multiplier {high}")
    while high - low > rel * high:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if epsilon_of(mid) <= target else (mid, high)
    return high


def calibrate(cfg: ExperimentConfig, *, pooled_size: int | None = None) -> ExperimentConfig:
    """``cfg`` with its strategy's noise set for ``cfg.target_epsilon`` (unchanged when it is 0)."""
    target = cfg.target_epsilon
    if target <= 0:
        return cfg
    if cfg.strategy == "gswgan":
        queries = math.ceil(cfg.steps * cfg.clients_per_step / len(cfg.participants()))
        per_query = smallest_noise(lambda nm: _ledger_epsilon(nm, 1.0, max(queries, 1), cfg.delta), target)
        budget = min(cfg.client_epsilon_budget or target, target)
        return cfg.replace(noise_multiplier=per_query * math.sqrt(cfg.batch_size), client_epsilon_budget=budget)
    if cfg.strategy == "dpgan":
        if pooled_size is None:
            raise ValueError("calibrating dpgan needs the pooled data size N")
        q = min(1.0, cfg.dpgan_batch_size / pooled_size)
        sigma = subsampled_noise(target, q, cfg.steps * cfg.dpgan_n_d, cfg.delta)
        budget = min(cfg.client_epsilon_budget or target, target)
        return cfg.replace(dpgan_noise_multiplier=sigma, client_epsilon_budget=budget)
    q = min(1.0, cfg.fedavg_clients_per_round / len(cfg.participants()))
    return cfg.replace(fedavg_noise_multiplier=subsampled_noise(target, q, cfg.steps, cfg.delta))


def subsampled_noise(target: float, sample_rate: float, steps: int, delta: float) -> float:
    """Opacus' get_noise_multiplier, nudged up until the ledger's own RDP grid agrees (≤ target).

    The subsampled RDP curve is costly to evaluate at many σ; Opacus' search lands within a hair of
    the answer, and its order grid differs slightly from the ledger's, hence the nudge.
    """
    from common.dpgan import calibrate_noise_multiplier

    sigma = calibrate_noise_multiplier(target_epsilon=target, sample_rate=sample_rate, steps=steps, delta=delta)
    while _ledger_epsilon(sigma, sample_rate, steps, delta) > target:
        sigma *= 1.002
    return sigma


def prepare(cfg: ExperimentConfig) -> ExperimentConfig:
    """What every entry point does before any work: check partition sizes against the batch size
    (reading the data where needed) and apply the --target-epsilon calibration."""
    from common.data import check_partition_sizes

    return calibrate(cfg, pooled_size=sum(check_partition_sizes(cfg)))
