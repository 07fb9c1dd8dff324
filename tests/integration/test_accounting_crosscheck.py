"""Every ε a run writes, recomputed from its recorded events by an independent accountant.

Each strategy runs briefly (in-process, tiny); privacy.json holds the ledgers the figures came from:
every client's and the server's (GS-WGAN's amplified, Fed-Avg's user-level). Google's dp-accounting
recomputes each ε from those events: RDP on the same orders within 1%, and its PLD accountant as a
further check where it applies (Gaussian and Poisson-subsampled events, beside our PRV figure and
never above our RDP one). A void event must come back unbounded, as privacy.json's null says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting as dpa
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from common.privacy.analysis import ORDERS
from simulations.cli import main
from tests.helpers import TRUST_SERVER_POLICY, tiny_flags

NR = dpa.NeighboringRelation
RUNS = {
    "gswgan": dict(num_clients=4, steps=10, clients_per_step=2, noise_multiplier=3.0),
    "dpgan": dict(strategy="dpgan", num_clients=3, steps=4, dpgan_batch_size=16, dpgan_n_d=3),
    # DPAC: the federated form's answers and the centralized form's classifier steps, recomputed too
    "gswgan-dpac": dict(num_clients=3, steps=6, noise_multiplier=3.0, dpac_beta=0.5, dpac_init=2),
    "dpgan-dpac": dict(
        strategy="dpgan", num_clients=3, steps=3, dpgan_batch_size=16, dpgan_n_d=2, dpac_beta=0.5, dpac_init=2
    ),
    # dpGAN's grouped clipping with public bounds and proportional noise, and a public warm start:
    # the same (σ, q) events as the plain run above, so the same ε (test below)
    "dpgan-grouped": dict(
        strategy="dpgan",
        num_clients=3,
        steps=4,
        dpgan_batch_size=16,
        dpgan_n_d=3,
        dpgan_clip_groups="layer",
        dpgan_group_bounds="public",
        dpgan_group_noise="proportional",
        dpgan_bounds_every=2,
        public_data="holdout",
        public_size=40,
        public_warmup_steps=2,
    ),
    "fedavg-gan": dict(
        strategy="fedavg-gan",
        num_clients=4,
        steps=4,
        fedavg_clients_per_round=2,
        fedavg_noise_multiplier=1.5,
        local_steps=1,
        server_g_steps=1,
    ),
}


def _dp_event(event: dict) -> dpa.DpEvent:
    if event.get("void") or event["noise_multiplier"] == 0:
        inner: dpa.DpEvent = dpa.NonPrivateDpEvent()
    else:
        gaussian = dpa.GaussianDpEvent(event["noise_multiplier"])
        if event["sampling"] == "poisson":
            inner = dpa.PoissonSampledDpEvent(event["sample_rate"], gaussian)
        elif event["sampling"] == "wor":
            n = event["population"]
            inner = dpa.SampledWithoutReplacementDpEvent(n, round(event["sample_rate"] * n), gaussian)
        else:
            inner = gaussian
    return dpa.SelfComposedDpEvent(inner, event["count"])


def _relation(history: list[dict]) -> NR:
    return NR.REPLACE_ONE if any(e["sampling"] == "wor" for e in history) else NR.ADD_OR_REMOVE_ONE


def independent_rdp(ledger: dict, delta: float) -> float:
    history = ledger["history"]
    accountant = RdpAccountant(orders=list(ORDERS), neighboring_relation=_relation(history))
    accountant.compose(dpa.ComposedDpEvent([_dp_event(e) for e in history]))
    return accountant.get_epsilon(delta)


def independent_pld(ledger: dict, delta: float) -> float | None:
    """dp-accounting's PLD ε, or None where it does not apply (sampling without replacement)."""
    history = ledger["history"]
    if any(e["sampling"] == "wor" for e in history):
        return None
    accountant = PLDAccountant(neighboring_relation=NR.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3)
    accountant.compose(dpa.ComposedDpEvent([_dp_event(e) for e in history]))
    return accountant.get_epsilon(delta)


def check(reported: float | None, ledger: dict, delta: float, prv: float | None = None) -> None:
    if not ledger["history"]:
        assert reported == 0
        return
    rdp = independent_rdp(ledger, delta)
    if math.isinf(rdp):
        assert reported is None  # unbounded: null in JSON, never a number
        return
    assert reported == pytest.approx(rdp, rel=0.01)
    pld = independent_pld(ledger, delta)
    if pld is not None:
        assert pld <= reported * (1 + 1e-6)  # RDP is the looser bound
        if prv is not None:  # both near-exact: PRV's upper bound sits within its error of PLD's
            assert pld * 0.97 - 0.05 <= prv <= pld * 1.03 + 0.05


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    out = {}
    for name, changes in RUNS.items():
        path = tmp_path_factory.mktemp(name) / "run"
        assert main(["simulate", *tiny_flags(**changes, out=path), "--node-policy", str(TRUST_SERVER_POLICY)]) == 0
        out[name] = json.loads((path / "privacy.json").read_text())
    return out


@pytest.mark.parametrize("strategy", list(RUNS))
def test_every_per_client_epsilon_is_recomputed_from_its_ledger(runs, strategy):
    privacy = runs[strategy]
    assert privacy["clients"] and any(c["queries"] for c in privacy["clients"])
    for c in privacy["clients"]:
        check(c["epsilon"], c["ledger"], privacy["delta"], c.get("epsilon_prv"))
        assert c["epsilon_rdp"] == c["epsilon"]  # the headline is RDP (accountant "rdp")


@pytest.mark.parametrize("strategy", ["gswgan", "fedavg-gan"])
def test_the_server_side_epsilon_is_recomputed_from_the_servers_ledger(runs, strategy):
    amplified = runs[strategy]["epsilon_amplified"]
    ledger = amplified["ledger"]
    assert ledger["history"] and amplified["steps"] == sum(e["count"] for e in ledger["history"])
    assert amplified["sampling"] == {"gswgan": "wor", "fedavg-gan": "poisson"}[strategy]
    check(amplified["epsilon"], ledger, runs[strategy]["delta"])


def test_fedavg_clients_are_unbounded_and_dp_accounting_agrees(runs):
    sent = [c for c in runs["fedavg-gan"]["clients"] if c["queries"]]
    assert sent and all(c["epsilon"] is None for c in sent)
    assert all(math.isinf(independent_rdp(c["ledger"], 1e-5)) for c in sent)


def test_the_debugging_tasks_selection_is_in_both_groups_figures(tmp_path):
    """Selection + GS-WGAN answers in each client's ledger, selection + without-replacement steps in
    each group's server ledger: dp-accounting recomputes both, for members and non-members alike."""
    out = tmp_path / "dbg"
    args = tiny_flags(num_clients=6, steps=6, noise_multiplier=3.0, out=out)
    assert main(["debug-task", *args, "--num-samples", "50"]) == 0
    for group in ("suspect", "rest"):
        privacy = json.loads((Path(out) / group / "privacy.json").read_text())
        assert all(c["queries"] >= 1 for c in privacy["clients"])  # everyone's selection release
        for c in privacy["clients"]:
            check(c["epsilon"], c["ledger"], privacy["delta"], c.get("epsilon_prv"))
        amplified = privacy["epsilon_amplified"]
        kinds = [e["sampling"] for e in amplified["ledger"]["history"]]
        # a group of one client is "sampled" with q = 1: no amplification, recorded as such
        assert kinds[0] == "none" and len(kinds) > 1 and set(kinds[1:]) <= {"wor", "none"}
        check(amplified["epsilon"], amplified["ledger"], privacy["delta"])


def test_grouped_clipping_and_public_data_cost_what_flat_clipping_costs(runs):
    """The grouped run's sensitivity is √Σ C_j² = C and the public data is free: its ledger and ε are
    the plain DPGAN run's (same σ, q, steps: the holdout is writers outside the federation)."""
    plain, grouped = runs["dpgan"]["clients"][0], runs["dpgan-grouped"]["clients"][0]
    assert grouped["queries"] == plain["queries"] == 12
    assert grouped["epsilon"] == pytest.approx(plain["epsilon"], rel=1e-12)
    (p_event,), (g_event,) = plain["ledger"]["history"], grouped["ledger"]["history"]
    assert g_event["noise_multiplier"] == p_event["noise_multiplier"] and g_event["count"] == p_event["count"]
    assert g_event["sample_rate"] == p_event["sample_rate"] == pytest.approx(16 / 120)  # public: other writers
    assert "clipped per parameter group (layer" in runs["dpgan-grouped"]["statement"]
    assert "Declared public" in runs["dpgan-grouped"]["statement"]
