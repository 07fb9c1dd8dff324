"""``--device`` resolution and the process-wide numerics (CPU only: tests never need a GPU)."""

from __future__ import annotations

import pytest
import torch

from common.device import check_device_name, resolve_device


def test_auto_and_cpu_resolve_to_a_device_that_exists() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_fails_up_front_and_says_what_to_do(name: str) -> None:
    with pytest.raises(ValueError, match=r"CUDA is not available here .*--device cpu"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "mps", ""])
def test_unknown_device_names_are_refused_with_the_choices(name: str) -> None:
    assert "auto, cpu, cuda" in check_device_name(name)
    with pytest.raises(ValueError, match="must be one of auto, cpu, cuda or cuda:N"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_simulate_asked_for_cuda_without_one_stops_before_the_run_directory(tmp_path, capsys) -> None:
    from simulations.cli import main

    out = tmp_path / "run"
    code = main(["simulate", "--transport", "inprocess", "--device", "cuda", "--steps", "1", "--out", str(out)])
    assert code == 2
    assert "device 'cuda' asked for, but CUDA is not available here" in capsys.readouterr().err
    assert not out.exists()
