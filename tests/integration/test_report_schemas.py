"""summary.json and privacy.json of every method are the JSON mappings of protos/fedgan.proto."""

import json

import pytest
from google.protobuf import json_format

from common.methods import METHODS
from protos import fedgan_pb2 as pb
from simulations.cli import main
from tests.helpers import TINY_FLAGS, TRUST_SERVER_POLICY


@pytest.mark.parametrize("strategy", list(METHODS))
def test_run_reports_parse_strictly_with_the_schema(tmp_path, strategy):
    out = tmp_path / "run"
    trusting = ["--node-policy", str(TRUST_SERVER_POLICY)]  # Fed-Avg's nodes send raw deltas to a trusted server
    assert main(["simulate", "--strategy", strategy, *TINY_FLAGS, "--steps", "2", "--out", str(out), *trusting]) == 0
    raw = {name: json.loads((out / name).read_text()) for name in ("summary.json", "privacy.json")}
    summary = json_format.ParseDict(raw["summary.json"], pb.RunSummary())
    privacy = json_format.ParseDict(raw["privacy.json"], pb.PrivacyReport())
    assert summary.strategy == strategy and summary.steps_completed == 2
    assert len(privacy.clients) >= 1
    for document in raw.values():  # the method's own parameters, under its name only, as plain values
        assert list(document["method"]) == [strategy]
        assert document["method"][strategy] and all(
            isinstance(v, (int, float, str, bool, type(None))) for v in document["method"][strategy].values()
        )
