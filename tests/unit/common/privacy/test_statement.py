"""Privacy statements: generated in one place from ledgers; they name δ, the accountant, the rules,
and say NOT PRIVATE when a ledger holds a non-private release."""

from __future__ import annotations

import math

import pytest

from common.methods import ExperimentConfig
from common.methods.dpgan import privacy as dpgan_privacy
from common.methods.fedavg_gan import privacy as fedavg_privacy
from common.methods.fedavg_gan import release as fedavg_release
from common.methods.gswgan import privacy as gswgan_privacy
from common.methods.gswgan.privacy import RULE_AMPLIFIED_WOR, RULE_PER_CLIENT
from common.privacy import PrivacyEvent, PrivacyLedger
from common.privacy.events import VOID_NOISE_SEED, VOID_RAW_DELTA
from common.privacy.statement import (
    KIND_EXAMPLE,
    client_entry,
    epsilon_meaning,
    max_epsilon,
    per_client_sentence,
    server_entry,
)

DELTA = 1e-5
NM = 1.07 / math.sqrt(32)
GS = dict(delta=DELTA, accountant="rdp", noise_multiplier=1.07, batch_size=32)


def gswgan_statement(ledgers, server, **options) -> str:
    """GS-WGAN's statement of a run configured with ``options``."""
    return gswgan_privacy.statement(ExperimentConfig(**options), ledgers, server)


def dpgan_statement(ledger, **options) -> str:
    return dpgan_privacy.statement(ExperimentConfig(strategy="dpgan", **options), ledger)


def fedavg_statement(ledgers, server, *, clip: float, noise_multiplier: float, **options) -> str:
    cfg = ExperimentConfig(strategy="fedavg-gan", fedavg_clip=clip, fedavg_noise_multiplier=noise_multiplier, **options)
    return fedavg_privacy.statement(cfg, ledgers, server, fedavg_release.release_spec(cfg))


def _ledgers(counts: dict[int, int], void: str = "") -> dict[int, PrivacyLedger]:
    return {
        cid: PrivacyLedger([PrivacyEvent(noise_multiplier=NM, count=n, void=void)] if n else [])
        for cid, n in counts.items()
    }


def _server(steps: int, population: int = 4, void: str = "") -> PrivacyLedger:
    return PrivacyLedger(
        [
            PrivacyEvent(
                noise_multiplier=NM,
                sample_rate=1 / population,
                count=steps,
                sampling="wor",
                population=population,
                void=void,
            )
        ]
        if steps
        else []
    )


def test_statement_names_rules_delta_and_both_figures_from_the_ledgers() -> None:
    ledgers = _ledgers({0: 2, 1: 5, 2: 3, 3: 0})
    server = _server(10)
    text = gswgan_statement(ledgers, server, **GS)
    worst = ledgers[1].epsilon(delta=DELTA)
    assert "δ = 1e-05" in text and "RDP" in text and "PRV" in text
    assert RULE_PER_CLIENT in text and RULE_AMPLIFIED_WOR in text
    assert "client (1, 5 releases)" in text and f"{worst:.3g}" in text and "3 of 4 clients" in text
    amplified = server.epsilon(delta=DELTA)
    assert f"{amplified:,.0f}" in text or f"{amplified:.3g}" in text
    assert "weak" in text and "NOT PRIVATE" not in text


def test_statement_without_releases() -> None:
    text = gswgan_statement(_ledgers({0: 0, 1: 0}), _server(0), **GS)
    assert "no client has released anything, so ε = 0" in text and "weak" not in text


def test_a_void_ledger_makes_the_statement_not_private() -> None:
    ledgers = _ledgers({0: 2, 1: 1}, void=VOID_NOISE_SEED)
    text = gswgan_statement(ledgers, _server(3, void=VOID_NOISE_SEED), **GS)
    assert text.startswith("NOT PRIVATE: " + VOID_NOISE_SEED)
    assert "ε is unbounded for 2 of them" in text
    entry = client_entry(0, ledgers[0], delta=DELTA, accountant="rdp")
    assert entry["epsilon"] is None and entry["epsilon_reason"].startswith("unbounded: NOT PRIVATE")
    assert max_epsilon([entry]) is None


def test_prv_headline_falls_back_to_rdp_and_says_so() -> None:
    wor = _server(5)
    entry = server_entry(wor, delta=DELTA, accountant="prv", kind="k", rule="r")
    assert entry["epsilon"] == wor.epsilon(delta=DELTA) and "RDP shown" in entry["epsilon_reason"]
    small = PrivacyLedger([PrivacyEvent(noise_multiplier=2.0, count=3)])
    prv = client_entry(0, small, delta=DELTA, accountant="prv")
    assert prv["epsilon"] == small.epsilon(delta=DELTA, accountant="prv") < small.epsilon(delta=DELTA)
    assert prv["epsilon_reason"] == ""


def test_dpgan_and_fedavg_statements_name_their_own_guarantee() -> None:
    curator = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.05, count=40, sampling="poisson")])
    text = dpgan_statement(curator, delta=DELTA, accountant="rdp")
    assert "every training example" in text and f"{curator.epsilon(delta=DELTA):.3g}" in text
    clients = {0: PrivacyLedger([PrivacyEvent(noise_multiplier=0.0, void=VOID_RAW_DELTA)]), 1: PrivacyLedger()}
    server = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.5, count=3, sampling="poisson")])
    text = fedavg_statement(clients, server, delta=DELTA, accountant="rdp", clip=0.1, noise_multiplier=1.0)
    assert "ε is unbounded for 1 of them" in text and "user-level" in text
    assert not text.startswith("NOT PRIVATE")  # raw deltas are the strategy, not a debugging option


def test_gswgan_statement_says_the_warm_start_and_the_basis_cost_nothing():
    text = gswgan_statement(_ledgers({0: 3}), _server(3), **GS, warmup_steps=200, grad_dct=8)
    assert "8x8 lowest 2-D DCT coefficients" in text
    assert "non-private warm start (200 iterations on its own data)" in text and "cost no privacy" in text
    plain = gswgan_statement(_ledgers({0: 3}), _server(3), **GS)
    assert "DCT" not in plain and "warm start" not in plain and "never released" in plain


@pytest.mark.parametrize(
    ("eps", "words"),
    [(0.5, "e^0.5;"), (8.0, "e^8;"), (100.0, "vacuous"), (None, "no guarantee"), (math.inf, "no guarantee")],
)
def test_epsilon_meaning_bounds_the_odds_and_points_at_the_frontier(eps, words):
    """Issue 43: no word on what papers usually target ("moderate, the usual target of the papers")."""
    text = epsilon_meaning(eps, delta=1e-5)
    assert words in text and "frontier" in text and "papers" not in text
    if eps is not None and math.isfinite(eps):
        assert f"e^{eps:.3g}" in text and "δ = 1e-05" in text
    assert epsilon_meaning(eps, delta=1e-5, measured="MEASURED").endswith("; MEASURED")


def test_epsilon_meaning_names_the_unit_it_protects():
    assert "one client's whole data set, against the server itself" in epsilon_meaning(10.0, delta=1e-5)
    example = epsilon_meaning(10.0, delta=1e-5, kind=KIND_EXAMPLE)
    assert "one training example" in example and "client" not in example
    secure = epsilon_meaning(1.0, delta=1e-5, kind="per client, server runs the secure sum, no colluding client")
    assert "no inference about one client's whole data set (server runs the secure sum, no colluding client)" in secure


def test_dpac_is_named_in_both_statements():
    fed = gswgan_statement(_ledgers({0: 3}), _server(3), **GS, dpac_beta=0.5)
    assert "DPAC (β = 0.5)" in fed and "clipped and noised once" in fed
    assert "DPAC" not in gswgan_statement(_ledgers({0: 3}), _server(3), **GS)
    ledger = PrivacyLedger([PrivacyEvent(noise_multiplier=1.0, sample_rate=0.1, count=5, sampling="poisson")])
    central = dpgan_statement(ledger, delta=1e-5, accountant="rdp", dpac_beta=0.5)
    assert "auxiliary classifier's DP-SGD steps" in central


def test_without_noise_no_client_is_named_most_exposed():
    """Issue 14, item 18: at σ = 0 the statement named the client with the fewest queries."""
    ledgers = {
        0: PrivacyLedger([PrivacyEvent(noise_multiplier=0.0, sample_rate=1.0, count=1)]),
        1: PrivacyLedger([PrivacyEvent(noise_multiplier=0.0, sample_rate=1.0, count=5)]),
    }
    text, worst = per_client_sentence(ledgers, delta=1e-5, accountant="rdp", what="answers")
    assert worst is None and "unbounded for 2 of them" in text and "most exposed" not in text
