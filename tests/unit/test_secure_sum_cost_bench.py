"""The secure-sum cost benchmark (bench/secure_sum_cost.py) at a tiny size: it runs both arms, writes
its JSON and table, and the secure sum costs more bytes than the plain float32 upload it replaces."""

import json

from tests.helpers import ROOT
from tests.unit.test_bench_scripts import load_bench


def test_a_tiny_secure_sum_cost_run_writes_both_arms(tmp_path, monkeypatch, capsys):
    module = load_bench(ROOT / "bench" / "secure_sum_cost.py", monkeypatch)
    argv = ["--cohorts", "5", "--dim", "20", "--epsilons", "1", "--graph", "complete", "--out-dir", str(tmp_path)]
    assert module.main(argv) == 0
    result = json.loads((tmp_path / "secure-sum-cost.json").read_text())
    assert {"dim", "epsilons", "rows", "command", "definition"} <= set(result)
    (row,) = result["rows"]
    assert (row["cohort"], row["dim"], row["degree"], row["graph"]) == (5, 20, 4, "complete")
    assert {"down", "up", "total", "seconds"} <= set(row["plain"])
    (secure,) = row["secure"]
    assert {"epsilon", "threshold", "plan_bits", "bits", "masked_dtype", "seconds_by_round"} <= set(secure)
    assert set(secure["bytes_per_client_by_round"]) == {"advertise", "share", "mask", "unmask"}
    assert secure["threshold"] == 3 and secure["survivors"] == 5 and secure["bits"] >= secure["plan_bits"]
    assert secure["total"] > row["plain"]["total"] and secure["up"] > row["plain"]["up"]
    assert secure["ratio_bytes"] == secure["total"] / row["plain"]["total"] > 1
    assert "| 5 | complete | 1 |" in (tmp_path / "secure-sum-cost.md").read_text()
    assert "secure_sum_cost (d=20" in capsys.readouterr().out
