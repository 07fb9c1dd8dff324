"""Where tensors live (``--device``) and the process-wide numerics every fedgan process sets.

Random number generators that privacy or reproducibility rests on stay on the CPU whatever the
device (the server's latents and labels, a client's data cursor, the noise seeded from ``secrets``):
their streams are then the same on every machine, and a CUDA run differs from a CPU run only by
floating-point rounding. Tensors drawn from them are moved to the device after the draw.
"""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device_name(name: str) -> str:
    """``""`` when ``name`` is a device fedgan accepts (``auto``, ``cpu``, ``cuda``, ``cuda:N``), else why not."""
    if name in DEVICE_CHOICES:
        return ""
    if name.startswith("cuda:") and name[5:].isdigit():
        return ""
    return f"must be one of {', '.join(DEVICE_CHOICES)} or cuda:N"


def resolve_device(name: str) -> torch.device:
    """The torch device for ``name``: ``auto`` is CUDA where a GPU is visible, else the CPU.

    Asking for CUDA where there is none fails here, before any work, with the reason torch gives
    (no GPU visible, or a CPU-only build of torch), rather than deep inside the first step.
    """
    problem = check_device_name(name)
    if problem:
        raise ValueError(f"device {name!r}: {problem}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(f"device {name!r} asked for, but CUDA is not available here ({why}); use --device cpu")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} GPU(s) are visible")
    return device
