"""protos/: generated code is current, and summary.json / privacy.json are the schemas' JSON mappings."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from common.codec import GsAnswer, GsQuery
from protos import fedgan_pb2 as pb
from simulations.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_generated_module_is_not_stale(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}",
                    str(ROOT / "protos" / "fedgan.proto")], check=True, timeout=120)
    fresh = (tmp_path / "fedgan_pb2.py").read_bytes()
    assert fresh == (ROOT / "protos" / "fedgan_pb2.py").read_bytes(), "run `make protos` and commit the result"


def test_generated_dataplane_modules_are_not_stale(tmp_path):
    (tmp_path / "protos").mkdir()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(ROOT / "protos" / "dataplane.proto")], check=True,
                   timeout=120)
    for name in ("dataplane_pb2.py", "dataplane_pb2_grpc.py"):
        fresh = (tmp_path / "protos" / name).read_bytes()
        assert fresh == (ROOT / "protos" / name).read_bytes(), f"{name}: run `make protos` and commit the result"


@pytest.mark.parametrize("strategy", ["gswgan", "dpgan", "fedavg-gan"])
def test_run_reports_parse_strictly_with_the_schema(tmp_path, strategy):
    out = tmp_path / "run"
    assert main(["simulate", "--strategy", strategy, "--transport", "inprocess", "--num-clients", "3",
                 "--steps", "2", "--model", "tiny", "--batch-size", "8", "--n-critic", "1",
                 "--synthetic-samples-per-writer", "40", "--dpgan-batch-size", "16", "--dpgan-n-d", "1",
                 "--fedavg-clients-per-round", "2", "--no-eval", "--no-progress", "--out", str(out)]) == 0
    summary = json_format.ParseDict(json.loads((out / "summary.json").read_text()), pb.RunSummary())
    privacy = json_format.ParseDict(json.loads((out / "privacy.json").read_text()), pb.PrivacyReport())
    assert summary.strategy == strategy and summary.steps_completed == 2
    assert len(privacy.clients) >= 1


def test_payload_messages_cover_the_codec_fields():
    answer_fields = {f.name for f in pb.GsAnswer.DESCRIPTOR.fields}
    assert {f.name for f in dataclasses.fields(GsAnswer)} <= answer_fields
    assert {f.name for f in dataclasses.fields(GsQuery)} <= {f.name for f in pb.GsQuery.DESCRIPTOR.fields}
