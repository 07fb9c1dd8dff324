"""Write a PEP 503 "simple" index of the wheels in a directory, for pip's --index-url.

    python deploy/offline/wheel_index.py WHEEL_DIR INDEX_DIR
    python deploy/offline/wheel_index.py --requirements pyproject.toml   (what a node installs)

INDEX_DIR/simple/<project>/index.html links to INDEX_DIR/files/<wheel> (hard links or copies of the
wheels), so `python -m http.server --directory INDEX_DIR` serves an index that pip installs from
without reaching any other host (the offline image builds use it, build-images.sh).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
from pathlib import Path


def project(wheel: str) -> str:
    """The normalized project name of a wheel file name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def write(wheels: Path, out: Path) -> int:
    files, simple = out / "files", out / "simple"
    files.mkdir(parents=True, exist_ok=True)
    by_project: dict[str, list[str]] = {}
    for wheel in sorted(p.name for p in wheels.glob("*.whl")):
        target = files / wheel
        if not target.exists():
            try:
                os.link(wheels / wheel, target)
            except OSError:
                shutil.copy2(wheels / wheel, target)
        by_project.setdefault(project(wheel), []).append(wheel)
    for name, names in by_project.items():
        page = simple / name
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="../../files/{html.escape(w)}">{html.escape(w)}</a>\n' for w in names)
        (page / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    (simple / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n"
        + "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(by_project))
        + "</body></html>\n"
    )
    return len(by_project)


def requirements(pyproject: Path) -> list[str]:
    """The project's dependencies as a deployed node installs them (flwr without the simulation
    extra, as ./Dockerfile does) and its build backend's requirements."""
    import tomllib

    data = tomllib.loads(pyproject.read_text())
    deps = [re.sub(r"^flwr\[simulation\]", "flwr", d) for d in data["project"]["dependencies"]]
    return [*deps, *data["build-system"]["requires"], "wheel"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--requirements":
        print("\n".join(requirements(Path(sys.argv[2]))))
        raise SystemExit(0)
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(f"wheel index: {write(Path(sys.argv[1]), Path(sys.argv[2]))} projects", file=sys.stderr)
