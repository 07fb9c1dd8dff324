"""`fedgan audit` as a regression guard (issue 27): canary clients through DP-MERF's own release code
must not show more privacy loss than the ledger charges when the mechanism is intact, and must show
more when it is broken — noise halved, a release not charged, a noise stream an attacker can predict."""

import json

import pytest
import torch

from common.channels.local import LocalChannel
from common.methods import ExperimentConfig, prepare
from common.methods.dp_merf import client as dp_merf
from common.privacy import PrivacyLedger
from common.privacy.sanitizer import noise_generator
from simulations.cli import main
from simulations.experiments.audit import audit
from tests.helpers import tiny_flags

# At ledger ε 10 (μ 1.9, whose Gaussian curve gives 9.3) the bound from 4,000 canaries finds ~8; the
# breaks give μ 2.7 (a second, uncharged release), 3.8 (half the noise) or a perfect separation.
CANARIES = 4000


def cfg():
    return prepare(ExperimentConfig(strategy="dp-merf", model="tiny", merf_features=10, target_epsilon=10.0))


def test_an_intact_release_is_consistent_with_its_ledger():
    result = audit(cfg(), canaries=CANARIES, releases=3)  # the run's budget allows one release each
    assert result["ledger_releases"] == 1 and not result["violated"]
    assert result["epsilon_lower"] <= result["epsilon_ledger"]
    assert result["epsilon_gaussian_lower"] > result["epsilon_ledger"] / 2  # and near it: the audit is not blind


def test_halved_noise_is_caught(monkeypatch):
    noised = LocalChannel.noised  # the local channel noises DP-MERF's release: half its noise

    def halved(self, cfg, spec, clipped, noise):
        return clipped + (noised(self, cfg, spec, clipped, noise) - clipped) / 2

    monkeypatch.setattr(LocalChannel, "noised", halved)
    assert audit(cfg(), canaries=CANARIES, releases=1)["violated"]


def test_a_release_that_is_never_charged_is_caught(monkeypatch):
    """The first release of each client goes unrecorded: its budget then lets a second one out."""
    config = cfg()  # calibrated before the break (calibration composes ledgers too)
    record, seen = PrivacyLedger.record, set()

    def first_one_lost(self, event):
        if id(self) not in seen:
            seen.add(id(self))
            return
        record(self, event)

    monkeypatch.setattr(PrivacyLedger, "record", first_one_lost)
    result = audit(config, canaries=2 * CANARIES, releases=3)  # the smallest of the breaks: more canaries
    assert result["ledger_releases"] == 1 and result["violated"]


def test_a_predictable_noise_stream_is_caught(monkeypatch):
    monkeypatch.setattr(dp_merf, "release_noise_source", lambda seed, client, stream: (noise_generator(7), ""))
    result = audit(cfg(), canaries=CANARIES, releases=1)
    assert result["violated"] and result["epsilon_lower"] > 2 * result["epsilon_ledger"]


def test_fedgan_audit_writes_its_record_and_report_section(tmp_path, capsys):
    run = tmp_path / "run"
    flags = tiny_flags(strategy="dp-merf", num_clients=4, steps=3, target_epsilon=4.0, merf_features=10, out=run)
    assert main(["simulate", *flags]) == 0
    assert main(["audit", str(run), "--canaries", "500", "--mia-samples", "60"]) == 0
    record = json.loads((run / "audit.json").read_text())
    assert record["releases_per_canary"] == 1 and record["canaries"] == 500 and not record["violated"]
    assert 0.0 <= record["membership"]["auc"] <= 1.0
    assert "Privacy audit" in (run / "report.html").read_text()
    assert (run / "plots" / "audit_scores.png").stat().st_size > 1000
    assert "consistent with the ledger" in capsys.readouterr().out
    assert main(["audit", str(tmp_path / "missing")]) == 2


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("grad_dct", [0, 8])
def test_gswgan_canaries_answer_through_the_clients_own_sanitizer_and_wire(grad_dct):
    """GS-WGAN's canaries answer queries until their budget refuses; each answer is sanitized and
    float16-encoded by the client's own code, in pixels or in DCT coefficients."""
    config = prepare(ExperimentConfig(model="tiny", num_clients=20, steps=60, grad_dct=grad_dct, target_epsilon=10.0))
    result = audit(config, canaries=400, releases=50)
    assert result["ledger_releases"] >= 3 and not result["violated"]
    assert result["epsilon_ledger"] == pytest.approx(10.0, abs=0.5) and result["mu_lower"] > 0


def test_a_secure_aggregation_run_is_not_audited_with_the_wrong_mechanism():
    secure = prepare(
        ExperimentConfig(
            strategy="dp-merf",
            model="tiny",
            merf_features=10,
            target_epsilon=10.0,
            secure_aggregation=True,
            secagg_cohort=5,
        )
    )
    with pytest.raises(ValueError, match="does not cover releases through secure sums"):
        audit(secure, canaries=10, releases=1)
