"""The figure beside the headline (summary.json's ``epsilon_amplified``) is drawn and captioned for what
it is: through secure sums it is the ε against a server that deviates from the secure sum, which rests
on no client sampling, so neither the figure nor report.html may call it amplified (issue 43)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.evaluation import plots
from common.evaluation.report import write_report

DELTA = 1e-5
DEVIATING = "per client, server deviates from the secure sum"
SECURE_SUMMARY = {  # the shape of a GS-WGAN run through secure sums (summary.json)
    "strategy": "gswgan",
    "delta": DELTA,
    "epsilon_kind": "per client, server runs the secure sum, no colluding client",
    "clients": [{"client_id": c, "queries": 3, "epsilon": 31.09} for c in range(3)],
    "epsilon_amplified": {
        "epsilon": 49.4,
        "epsilon_reason": "",
        "kind": DEVIATING,
        "assumption": "against a server that deviates from the protocol, only the client's own noise share protects it",
        "steps": 3,
        "sample_rate": 1.0,
        "sampling": "none",
    },
    "privacy_statement": "Privacy statement (δ = 1e-05).",
}


def _drawn_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every title, text and legend entry of the figures drawn from now on."""
    texts: list[str] = []
    save = plots._save

    def capture(fig, path):
        for ax in fig.axes:
            legend = ax.get_legend()
            texts.extend([ax.get_title(), ax.get_xlabel(), *(t.get_text() for t in ax.texts)])
            texts.extend(t.get_text() for t in (legend.get_texts() if legend else []))
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", capture)
    return texts


@pytest.mark.parametrize("clients", [3, 200])  # bars, and the histogram above 60 clients
def test_a_secure_runs_figure_is_the_deviating_servers_not_an_amplified_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clients: int
) -> None:
    summary = {**SECURE_SUMMARY, "clients": [{"client_id": c, "queries": 3, "epsilon": 31.09} for c in range(clients)]}
    texts = _drawn_texts(monkeypatch)
    plots.plot_epsilon_per_client(summary, tmp_path / "eps.png")
    assert f"ε {DEVIATING} = 49.4" in texts
    assert plots.AMPLIFIED_ABOVE_HINT not in texts  # "σ/√B too small": no sampling to help here
    assert not any("amplified" in t or "trusted sampling" in t for t in texts), texts
    assert any(t.startswith("ε per client, server runs the secure sum") for t in texts), texts  # the headline's kind


def test_a_secure_runs_training_curves_name_the_deviating_server(tmp_path: Path, monkeypatch) -> None:
    texts = _drawn_texts(monkeypatch)
    rows = [{"step": s, "privacy/epsilon_max": 10.0 * s, "privacy/epsilon_amplified": 16.0 * s} for s in (1, 2, 3)]
    kind = plots.headline_kind(SECURE_SUMMARY)
    plots.plot_training_curves(rows, tmp_path / "curves.png", delta=DELTA, beside_kind=DEVIATING, kind=kind)
    assert f"ε {DEVIATING}" in texts and not any("amplified" in t for t in texts), texts
    assert any(t.startswith("Privacy spent") and "ε per client, server runs the secure sum" in t for t in texts), texts
    assert not any("untrusted server" in t for t in texts), texts


def test_a_secure_runs_epsilon_axis_names_the_secure_sum(tmp_path: Path, monkeypatch) -> None:
    texts = _drawn_texts(monkeypatch)
    points = [{"step": s, "epsilon_max": 2.0 * s, "fid": 100.0 / s} for s in (1, 2)]
    plots.plot_epsilon_vs_fid(points, tmp_path / "fid.png", kind=plots.headline_kind(SECURE_SUMMARY))
    assert "ε spent, max over clients (server runs the secure sum, no colluding client)" in texts, texts
    plots.plot_epsilon_vs_fid(points, tmp_path / "clear.png", kind=plots.headline_kind({}))
    assert "ε spent, max over clients (untrusted server)" in texts, texts


def test_a_secure_runs_captions_claim_no_amplification(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(SECURE_SUMMARY))
    figs = {
        "epsilon_per_client": plots.plot_epsilon_per_client(SECURE_SUMMARY, run / "eps.png"),
        "training_curves": plots.plot_training_curves([], run / "curves.png", beside_kind=DEVIATING),
    }
    page = write_report(run, {}, figs).read_text()
    captions = dict(re.findall(r"<figcaption><b>(\w+)</b>: (.*?)</figcaption>", page))
    assert set(captions) == set(figs)
    for caption in captions.values():
        assert "amplified" not in caption and "trusted sampling" not in caption, caption
        assert "server deviates from the secure sum" in caption, caption
    assert "only the client&#x27;s own noise share protects it" in captions["epsilon_per_client"]


def test_the_amplified_figure_keeps_its_assumption(tmp_path: Path, monkeypatch) -> None:
    """GS-WGAN in the clear: the same figure is the amplified ε, drawn and captioned as an assumption."""
    summary = {**SECURE_SUMMARY, "epsilon_kind": "per client, untrusted server"}
    summary["epsilon_amplified"] = {"epsilon": 49.4, "kind": "amplified, trusted sampling", "assumption": "..."}
    texts = _drawn_texts(monkeypatch)
    plots.plot_epsilon_per_client(summary, tmp_path / "eps.png")
    assert "amplified ε = 49.4, trusted sampling (assumption)" in texts and plots.AMPLIFIED_ABOVE_HINT in texts
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary))
    page = write_report(run, {}, {"epsilon_per_client": tmp_path / "eps.png"}).read_text()
    assert "Dashed: the amplified ε, which assumes the server samples clients uniformly" in page


def test_the_amplified_kind_is_the_one_summary_json_writes() -> None:
    from common.evaluation.beside import AMPLIFIED_KIND, HEADLINE_KIND
    from common.privacy.statement import KIND_AMPLIFIED, KIND_PER_CLIENT

    assert AMPLIFIED_KIND == KIND_AMPLIFIED
    assert HEADLINE_KIND == KIND_PER_CLIENT
