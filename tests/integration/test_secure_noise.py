"""The noise a revealed sum carries is the noise every client is charged for (audit 4, item 5).

For each method with a secure form: its own plan, its clients' real ``client_vector`` on zero inputs
(so a deposit is its noise share alone), the real SecAgg+ sum over exactly t nodes (the fewest a sum
reveals), and the variance of the revealed sum's coordinates against 2μ, μ taken from the protocol
event the run's ledgers record, never from the plan's share. With k colluders, the colluders'
deposits (known to them, hence to the server) are subtracted first: the t − k honest shares left
must still carry 2μ. A share of μ/(2t) or μ/c (the mutations the audit tried) fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from client.app import app as client_app
from client.secure_sum import deposit_input
from common.methods.dp_merf.features import RANDOM_FOURIER
from common.methods.dp_ntk.features import TANGENT
from common.secagg.plan import SecureSumPlan, client_vector, coordinate_range, release_events
from server.secure_sum import secure_sum
from server.transport import InProcessTransport
from tests.helpers import secure_plan, tiny_cfg

SECURE = dict(secure_aggregation=True, num_clients=6)


def merf_plan(k: int, family=RANDOM_FOURIER) -> SecureSumPlan:
    strategy = "dp-ntk" if family is TANGENT else "dp-merf"
    cfg = tiny_cfg("", strategy=strategy, merf_features=100, secagg_cohort=5, secagg_colluders=k, **SECURE)
    return secure_plan(cfg)


def gswgan_plan(k: int) -> SecureSumPlan:
    cfg = tiny_cfg("", strategy="gswgan", clients_per_step=4, batch_size=4, secagg_colluders=k, **SECURE)
    return secure_plan(cfg)


def fedavg_plan(k: int) -> SecureSumPlan:
    cfg = tiny_cfg(
        "",
        strategy="fedavg-gan",
        fedavg_clients_per_round=4,
        fedavg_noise_multiplier=1.0,
        secagg_colluders=k,
        **SECURE,
    )
    return secure_plan(cfg)


PLANS = {
    "dp-merf": merf_plan,
    "dp-ntk": lambda k: merf_plan(k, TANGENT),
    "gswgan": gswgan_plan,
    "fedavg-gan": fedavg_plan,
}


def revealed_noise(plan: SecureSumPlan, sums: int) -> tuple[np.ndarray, float]:
    """Coordinates of ``sums`` revealed sums of exactly t zero-input deposits, less the k colluders'
    deposits; and the protocol event's μ the ledgers charge."""
    t, k, bound = plan.threshold, plan.colluders, coordinate_range(plan)
    draws = []
    for s in range(sums):
        transport = InProcessTransport(client_app, t)
        nodes = transport.node_ids(t)
        deposits = {node: client_vector(np.zeros(plan.dim), plan, -1, i, s) for i, node in enumerate(nodes)}
        for node, vector in deposits.items():
            deposit_input(transport.contexts[node], f"n{s}", vector, floor=t, bound=bound)
        result = secure_sum(transport, nodes, bound=bound, length=plan.dim, threshold=t, session=f"n{s}")
        assert result.revealed and result.survivors == nodes, result.aborted
        known = sum((deposits[n] for n in nodes[:k]), np.zeros(plan.dim, np.int64))
        draws.append((result.sum - known).astype(np.float64))
    protocol, _ = release_events(plan)
    return np.concatenate(draws), protocol.skellam_mu


@pytest.mark.parametrize("colluders", [0, 1])
@pytest.mark.parametrize("method", list(PLANS))
def test_a_sum_of_t_survivors_carries_the_charged_noise(method: str, colluders: int) -> None:
    plan = PLANS[method](colluders)
    draws, mu = revealed_noise(plan, sums=max(1, 12_000 // plan.dim))
    ratio = draws.var() / (2 * mu)
    # the sample variance of n Skellam draws is within 5 standard errors (≈ √(2/n) relative) of 2μ
    assert abs(ratio - 1) < 5 * np.sqrt(2 / draws.size), (method, colluders, ratio, draws.size)
    assert abs(draws.mean()) < 5 * np.sqrt(2 * mu / draws.size)


@pytest.mark.parametrize("method", list(PLANS))
def test_the_test_above_fails_on_a_share_the_audit_mutated(method: str, monkeypatch) -> None:
    """The same measurement with each client's share cut to μ/(2t) or μ/c: the ratio leaves the band."""
    plan = PLANS[method](0)
    for divisor in (2 * plan.threshold, plan.cohort):
        monkeypatch.setattr(SecureSumPlan, "mu_share", property(lambda p, d=divisor: p.mu / d))
        draws, mu = revealed_noise(plan, sums=max(1, 12_000 // plan.dim))
        assert abs(draws.var() / (2 * mu) - 1) > 5 * np.sqrt(2 / draws.size), (method, divisor)


def test_colluders_are_stated_and_calibrated_for(tmp_path) -> None:
    """Audit 4, item 1: DP-MERF, cohort 4, t 3, calibrated to a printed ε of 1. With shares calibrated
    for no colluder, one colluder raised the true ε to 1.25 (the audit's figure); with
    --secagg-colluders 1 the printed 1.00 holds against one colluder, and the statement names k and
    what one more colluder would cost."""
    from common.methods import prepare
    from common.privacy import PrivacyLedger
    from common.secagg.plan import colluding_event

    def run_plan(k: int) -> tuple[SecureSumPlan, float, float]:
        cfg = prepare(
            tiny_cfg(
                tmp_path / f"k{k}",
                strategy="dp-merf",
                merf_features=20,
                num_clients=8,
                secagg_cohort=4,
                secagg_threshold=3,
                secagg_colluders=k,
                target_epsilon=1.0,
                secure_aggregation=True,
            )
        )
        plan = secure_plan(cfg)
        protocol = release_events(plan)[0]
        printed = PrivacyLedger([protocol]).epsilon(delta=cfg.delta)
        one_colluder = PrivacyLedger([colluding_event(protocol, plan, 1)]).epsilon(delta=cfg.delta)
        return plan, printed, one_colluder

    _, printed, before = run_plan(0)
    assert printed == pytest.approx(1.0, abs=2e-3) and before == pytest.approx(1.25, abs=0.02)
    plan, printed, after = run_plan(1)
    assert printed == pytest.approx(1.0, abs=2e-3) and after == pytest.approx(printed, rel=1e-9)
    assert plan.mu_share == pytest.approx(plan.mu / 2)  # t − k = 2 honest shares carry μ
