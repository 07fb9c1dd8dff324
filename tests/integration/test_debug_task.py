"""`fedgan debug-task` end to end (tiny, in-process): selection, two generators, ledgers, outputs."""

import json

from common.data import invert_clients
from common.privacy import PrivacyLedger
from simulations.cli import main
from tests.helpers import tiny_flags


def test_debug_task_selects_inverted_clients_and_accounts_for_the_selection(tmp_path, capsys):
    out = tmp_path / "dbg"
    # σ_sel 0.05: the margin between upright (~0.9) and inverted (~0.1) accuracies is 8 noise stds
    args = ["debug-task", *tiny_flags(num_clients=6, steps=6, eval=None), "--num-samples", "100", "--out", str(out)]
    args += ["--selection-noise", "0.05"]
    assert main(args) == 0
    assert "bright samples" in capsys.readouterr().out
    result = json.loads((out / "debug_task.json").read_text())
    truth = invert_clients(6, 0.5, seed=0)
    assert truth.any() and not truth.all(), "the seed must give both kinds of clients"
    assert [v["inverted"] for v in result["selection"].values()] == truth.tolist()
    # A classifier trained on upright digits is far worse on inverted ones: the rule finds them.
    assert result["selection_precision"] == 1.0 and result["selection_recall"] == 1.0
    groups = result["groups"]
    assert sorted(groups["suspect"]["clients"] + groups["rest"]["clients"]) == list(range(6))
    for name, group in groups.items():
        assert 0.0 <= group["bright_fraction"] <= 1.0 and group["num_samples"] == 100
        privacy = json.loads((out / name / "privacy.json").read_text())
        summary = json.loads((out / name / "summary.json").read_text())
        for c in privacy["clients"]:
            answered = next(s["queries"] for s in summary["clients"] if s["client_id"] == c["client_id"])
            ledger = PrivacyLedger.from_state_dict(c["ledger"])
            # a member's own ledger: its GS-WGAN answers plus its one selection release
            assert ledger.queries == answered and c["epsilon"] > 0
            if c["client_id"] not in group["clients"]:
                # every client's selection release decided this group: it is in this group's report
                assert [(e.noise_multiplier, e.count) for e in ledger.history] == [(0.05, 1)]
        # the amplified figure composes the selection (everyone, unsampled) with the group's steps
        first = PrivacyLedger.from_state_dict(privacy["epsilon_amplified"]["ledger"]).history[0]
        assert (first.noise_multiplier, first.sampling, first.count) == (0.05, "none", 1)
        assert group["epsilon_max_per_client"] == max(c["epsilon"] for c in privacy["clients"])
    assert (out / "side_by_side.png").stat().st_size > 1000
