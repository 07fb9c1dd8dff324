"""protos/: the generated code is current (summary.json and privacy.json follow the schemas: see
tests/integration/test_report_schemas.py)."""

import subprocess
import sys

from tests.helpers import ROOT


def test_generated_module_is_not_stale(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}",
            str(ROOT / "protos" / "fedgan.proto"),
        ],
        check=True,
        timeout=120,
    )
    fresh = (tmp_path / "fedgan_pb2.py").read_bytes()
    assert fresh == (ROOT / "protos" / "fedgan_pb2.py").read_bytes(), "run `make protos` and commit the result"


def test_generated_dataplane_modules_are_not_stale(tmp_path):
    (tmp_path / "protos").mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "protos" / "dataplane.proto"),
        ],
        check=True,
        timeout=120,
    )
    for name in ("dataplane_pb2.py", "dataplane_pb2_grpc.py"):
        fresh = (tmp_path / "protos" / name).read_bytes()
        assert fresh == (ROOT / "protos" / name).read_bytes(), f"{name}: run `make protos` and commit the result"
