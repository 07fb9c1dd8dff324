"""Ledger: run-length history, persistence, cached ε, the budget refusal rule, PRV failures."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.privacy import ledger as ledger_module
from common.privacy.analysis import rdp_epsilon
from common.privacy.events import VOID_CLIENT_STATS, VOID_NOISE_SEED, VOID_RAW_DELTA
from common.privacy.ledger import PrivacyLedger
from common.privacy.sanitizer import PrivacyEvent

DELTA = 1e-5
NM = 1.07 / math.sqrt(32)
QUERY = PrivacyEvent(noise_multiplier=NM, sample_rate=1.0)


def _ledger(*counts_and_nms: tuple[int, float]) -> PrivacyLedger:
    ledger = PrivacyLedger()
    for count, nm in counts_and_nms:
        for _ in range(count):
            ledger.record(PrivacyEvent(noise_multiplier=nm, sample_rate=1.0))
    return ledger


def test_consecutive_equal_events_are_merged() -> None:
    ledger = _ledger((3, NM), (1, 0.5), (2, NM))
    assert [(e.noise_multiplier, e.count) for e in ledger.history] == [(NM, 3), (0.5, 1), (NM, 2)]
    assert ledger.queries == 6
    assert ledger.epsilon(delta=DELTA) == pytest.approx(
        rdp_epsilon([(NM, 1.0, 5), (0.5, 1.0, 1)], delta=DELTA)[0], rel=1e-12
    )


def test_empty_ledger() -> None:
    ledger = PrivacyLedger()
    assert ledger.queries == 0 and ledger.epsilon(delta=DELTA) == 0.0
    assert ledger.epsilon_both(delta=DELTA) == {
        "epsilon": 0.0,
        "epsilon_prv": 0.0,
        "epsilon_prv_reason": None,
        "order": None,
        "queries": 0,
    }


def test_state_dict_round_trips_through_json() -> None:
    ledger = _ledger((4, NM), (2, 0.9))
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = PrivacyLedger.from_state_dict(state)
    assert restored == ledger and restored.history == ledger.history
    assert restored.epsilon(delta=DELTA) == ledger.epsilon(delta=DELTA)
    other = _ledger((1, 3.0))
    other.load_state_dict(state)
    assert other == ledger


def test_load_rejects_foreign_state() -> None:
    with pytest.raises(ValueError):
        PrivacyLedger.from_state_dict({"history": []})
    with pytest.raises(ValueError):
        PrivacyLedger.from_state_dict(
            {"format": "fedgan.privacy_ledger/1", "history": [{"noise_multiplier": -1, "sample_rate": 1}]}
        )


def test_format_1_ledgers_still_load() -> None:
    old = {
        "format": "fedgan.privacy_ledger/1",
        "history": [
            {"noise_multiplier": NM, "sample_rate": 1.0, "count": 3},
            {"noise_multiplier": 1.0, "sample_rate": 0.01, "count": 5},
        ],
    }
    ledger = PrivacyLedger.from_state_dict(old)
    assert [e.sampling for e in ledger.history] == ["none", "poisson"] and ledger.queries == 8
    assert ledger.state_dict()["format"] == "fedgan.privacy_ledger/3"


def test_void_releases_make_epsilon_unbounded_with_the_reason() -> None:
    ledger = _ledger((3, NM))
    private = ledger.epsilon(delta=DELTA)
    ledger.record(PrivacyEvent(noise_multiplier=NM, void=VOID_NOISE_SEED))
    assert ledger.epsilon(delta=DELTA) == math.inf and ledger.epsilon(delta=DELTA, accountant="prv") == math.inf
    assert ledger.void_reasons == (VOID_NOISE_SEED,)
    assert ledger.unbounded_reason() == "unbounded: NOT PRIVATE: " + VOID_NOISE_SEED
    assert ledger.headline(delta=DELTA) == (math.inf, ledger.unbounded_reason())
    # The nominal ε (budget checks only) still counts the mechanism as if it had been private.
    assert ledger.nominal_rdp_epsilon(delta=DELTA)[0] == pytest.approx(_ledger((4, NM)).epsilon(delta=DELTA))
    assert ledger.nominal_rdp_epsilon(delta=DELTA)[0] > private
    restored = PrivacyLedger.from_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert restored == ledger and restored.void_reasons == (VOID_NOISE_SEED,)


def test_budget_check_ignores_void_marks_so_debugging_runs_stop_where_private_ones_do() -> None:
    voided = PrivacyLedger([PrivacyEvent(noise_multiplier=NM, count=5, void=VOID_CLIENT_STATS)])
    private = _ledger((5, NM))
    for budget in (300.0, 400.0, 1000.0):
        assert voided.would_exceed(budget=budget, delta=DELTA, next_event=QUERY) == private.would_exceed(
            budget=budget, delta=DELTA, next_event=QUERY
        )


def test_poisson_and_without_replacement_events_never_share_a_ledger() -> None:
    """Their bounds hold under different adjacency relations (add/remove vs replace-one)."""
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, sampling="poisson")])
    with pytest.raises(ValueError, match="cannot compose"):
        ledger.record(PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, sampling="wor", population=10))
    mixed = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0), PrivacyEvent(1.0, 0.25, sampling="wor", population=4)])
    assert mixed.prv_epsilon(delta=DELTA)[0] is None and "without replacement" in mixed.prv_epsilon(delta=DELTA)[1]
    with pytest.raises(ValueError, match="integer sample"):
        PrivacyEvent(noise_multiplier=1.0, sample_rate=0.3, sampling="wor", population=4)


def test_the_larger_record_wins() -> None:
    """A client ledger that lost releases (its state file deleted) or a server record that missed
    a late answer: whichever accounts for more is what reports keep."""
    small, large = _ledger((2, NM)), _ledger((3, NM))
    assert large.exceeds(small, delta=DELTA) and not small.exceeds(large, delta=DELTA)
    void = PrivacyLedger([PrivacyEvent(noise_multiplier=0.0, void=VOID_RAW_DELTA)])
    assert void.exceeds(large, delta=DELTA)
    assert not small.exceeds(small.copy(), delta=DELTA)


def test_epsilon_is_cached_until_the_next_record(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger_module.history_epsilon.cache_clear()  # shared by ledgers of other tests with this history
    calls = []
    real = ledger_module.epsilon_from_rdp
    monkeypatch.setattr(ledger_module, "epsilon_from_rdp", lambda *a, **k: calls.append(1) or real(*a, **k))
    ledger = _ledger((5, NM))
    first = ledger.epsilon(delta=DELTA)
    assert ledger.epsilon(delta=DELTA) == first and ledger.epsilon_both(delta=DELTA)["epsilon"] == first
    assert len(calls) == 1
    ledger.record(QUERY)
    assert ledger.epsilon(delta=DELTA) > first and len(calls) == 2


def test_ledgers_with_the_same_history_share_one_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A federation's clients mostly hold identical ledgers (DP-MERF: one release each); each ledger
    computed its own ε, 10^5 evaluations (57 s) for the first report at K = 10^5."""
    ledger_module.history_epsilon.cache_clear()
    calls = []
    real = ledger_module.epsilon_from_rdp
    monkeypatch.setattr(ledger_module, "epsilon_from_rdp", lambda *a, **k: calls.append(1) or real(*a, **k))
    ledgers = [_ledger((1, NM)) for _ in range(1000)]
    assert len({ledger.epsilon(delta=DELTA) for ledger in ledgers}) == 1 and len(calls) == 1
    assert _ledger((2, NM)).epsilon(delta=DELTA) > ledgers[0].epsilon(delta=DELTA) and len(calls) == 2


def test_many_identical_queries_cost_the_same_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 identical queries are one event with a count: one RDP curve evaluated, not 20,000
    (counted, not timed: a timing would measure the neighbours on a shared machine)."""
    ledger_module.history_epsilon.cache_clear()
    calls = []
    real = ledger_module.unit_rdp
    monkeypatch.setattr(ledger_module, "unit_rdp", lambda *a, **k: calls.append(1) or real(*a, **k))
    ledger = PrivacyLedger()
    for _ in range(20_000):
        ledger.record(QUERY)
    assert len(ledger.history) == 1 and ledger.queries == 20_000
    eps = ledger.epsilon(delta=DELTA)
    assert len(calls) == 1
    assert eps == pytest.approx(283082.5281893088, rel=1e-9)
    assert PrivacyLedger([PrivacyEvent(noise_multiplier=NM, sample_rate=1.0, count=20_000)]) == ledger


def test_epsilon_both_reports_prv_beside_rdp() -> None:
    report = _ledger((20, NM)).epsilon_both(delta=DELTA)
    assert report["epsilon"] == pytest.approx(390.26383633130706, rel=1e-9)
    assert report["epsilon_prv"] is not None and report["epsilon_prv"] <= report["epsilon"]
    assert report["epsilon_prv_reason"] is None and report["queries"] == 20
    assert 1.0 < report["order"] < 1.5
    json.dumps(report)


def test_prv_failure_is_none_with_reason_in_the_ledger() -> None:
    ledger = _ledger((60, NM))
    report = ledger.epsilon_both(delta=DELTA)
    assert report["epsilon_prv"] is None and "domain" in report["epsilon_prv_reason"]
    assert ledger.epsilon(delta=DELTA, accountant="prv") is None
    assert math.isfinite(ledger.epsilon(delta=DELTA, accountant="rdp"))
    with pytest.raises(ValueError):
        ledger.epsilon(delta=DELTA, accountant="gdp")


def test_no_noise_is_infinite() -> None:
    ledger = _ledger((1, 0.0))
    assert ledger.epsilon(delta=DELTA) == math.inf
    assert ledger.would_exceed(budget=1e9, delta=DELTA, next_event=QUERY)


def test_zero_budget_means_no_budget_and_check_does_not_record() -> None:
    ledger = _ledger((100, NM))
    assert not ledger.would_exceed(budget=0.0, delta=DELTA, next_event=QUERY)
    assert ledger.queries == 100
    with pytest.raises(ValueError):
        ledger.would_exceed(budget=-1.0, delta=DELTA, next_event=QUERY)


@settings(max_examples=40, deadline=None)
@given(nm=st.floats(0.3, 3.0), budget=st.floats(2.0, 60.0), burst=st.integers(1, 3))
def test_client_refusing_queries_never_exceeds_its_budget(nm: float, budget: float, burst: int) -> None:
    """A client answers while ``would_exceed`` is False: its ε ends ≤ budget, and the refused query
    would indeed have crossed it (the check is tight, not merely safe)."""
    ledger = PrivacyLedger()
    query = PrivacyEvent(noise_multiplier=nm, sample_rate=1.0, count=burst)
    for _ in range(2_000):
        if ledger.would_exceed(budget=budget, delta=DELTA, next_event=query):
            break
        ledger.record(query)
    else:
        pytest.fail("budget never reached")
    assert ledger.epsilon(delta=DELTA) <= budget
    ledger.record(query)
    assert ledger.epsilon(delta=DELTA) > budget
