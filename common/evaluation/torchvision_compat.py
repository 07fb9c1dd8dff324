"""Make pytorch-fid importable beside a CUDA-built torchvision wheel and a CPU-only torch.

PyPI serves torchvision only as a CUDA build; next to the CPU torch this project installs, its C
extension cannot load, and ``import torchvision`` then fails while registering meta kernels of its
detection ops (``torchvision::nms``). pytorch-fid needs only torchvision's pure-Python parts (the
Inception modules, transforms), so on exactly that failure the meta registrations are skipped and
the import retried. Any other torchvision error is left alone.
"""

from __future__ import annotations

import sys
import types

_MISSING_OPS = "torchvision::"


def ensure_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
    except RuntimeError as err:
        if _MISSING_OPS not in str(err):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401, F811
