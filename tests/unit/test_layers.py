"""The layers hold: dependencies point one way, and the ground floor never looks up.

- ``common/`` imports neither flwr nor ``protos``, ``server``, ``client`` or ``simulations``;
- the generic modules of ``common/`` (everything outside ``common/methods/``) never import
  ``common.methods``: they are handed what they need, and the registry is the one place that knows
  every method;
- ``server/`` never imports ``client/``, ``protos/wire.py`` only ``common``;
- outside the shells (``server/``, ``client/``) no string names a ``server.``/``client.`` module
  (a dotted path resolved at run time is an import no import graph shows);
- every module of the project is this checkout's (not another checkout's, through an editable install).

Imports are read from the source (every ``import`` statement, those inside functions and under
``TYPE_CHECKING`` too), so an upward arrow cannot hide from the check by being lazy.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGES = ("common", "server", "client", "protos", "simulations")
DOTTED_SHELL_MODULE = re.compile(r"^(server|client)\.[A-Za-z_]\w*(\.\w+)*(:\w+)?$")


def names_a_module(text: str) -> bool:
    """Whether ``text`` is a dotted path (``module`` or ``module:attribute``) to a module of the shells
    (``server.key``, a file name, is not)."""
    if not DOTTED_SHELL_MODULE.match(text):
        return False
    where = ROOT.joinpath(*text.partition(":")[0].split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, with_typing: bool = True) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved to absolute names; without
    ``with_typing``, less those under ``if TYPE_CHECKING:`` (annotations only: no runtime arrow)."""
    tree = ast.parse(path.read_text())
    skipped = (
        set()
        if with_typing
        else {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
    )
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)  # ``from common import methods``


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """``path: module`` for each import of a module in (or under) ``forbidden``."""
    out = []
    for path in paths:
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(ROOT)}: {name}")
    return sorted(set(out))


def test_common_imports_no_framework_no_wire_and_nothing_above_it():
    assert offending(sources("common"), ("flwr", "protos", "server", "client", "simulations")) == []


def test_the_ground_floor_never_looks_up_to_the_methods():
    generic = [p for p in sources("common") if "methods" not in p.relative_to(ROOT / "common").parts[:1]]
    assert len(generic) > 40  # the check reads the generic modules, not nothing
    assert offending(generic, ("common.methods",)) == []


def test_method_folders_import_no_framework_wire_or_shell():
    folders = [p for p in (ROOT / "common" / "methods").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(folders) >= 4
    assert (
        offending(sources(*(str(f.relative_to(ROOT)) for f in folders)), ("flwr", "protos", "server", "client")) == []
    )


def test_server_never_imports_the_client_and_the_wire_only_common():
    assert offending(sources("server"), ("client",)) == []
    assert offending([ROOT / "protos" / "wire.py"], ("server", "client", "simulations")) == []


def test_no_dotted_string_names_a_shell_module_outside_the_shells():
    found = []
    for path in sources("common", "protos", "simulations", "bench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and names_a_module(node.value):
                found.append(f"{path.relative_to(ROOT)}: {node.value!r}")
    assert found == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_this_checkouts(package):
    """An editable install of another checkout puts its folders on the path too: a module deleted
    here but imported somewhere would silently come from there."""
    for path in sources(package):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or module_name(path) == "client.worker":
            continue
        module = importlib.import_module(module_name(path))
        assert Path(module.__file__).resolve() == path.resolve(), module_name(path)
        for name in imports(path):
            top = name.split(".")[0]
            if top in PACKAGES:
                try:
                    imported = importlib.import_module(name)
                except ImportError:
                    continue  # ``from x import function``: the module itself was checked
                file = getattr(imported, "__file__", None)
                assert file is None or Path(file).resolve().is_relative_to(ROOT), f"{path}: {name} from {file}"


def import_circles() -> list[list[str]]:
    """Every strongly connected group of two or more project modules (Tarjan), lazy imports included."""
    modules = {module_name(p): p for p in sources(*PACKAGES)}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def arrows(m: str, path: Path) -> set[str]:  # a module's own parent packages are initialising already
        return {
            r for n in imports(path, with_typing=False) if (r := resolve(n)) and r != m and not m.startswith(r + ".")
        }

    graph = {m: arrows(m, p) for m, p in modules.items()}
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    """Issue 41: five circles had crept in (client app <-> worker, the data modules, GS-WGAN's client,
    privacy and secure form, the compose renderers...); a circle hides which module is the lower one."""
    assert import_circles() == []


def test_the_circle_check_finds_a_circle(tmp_path, monkeypatch):
    """The check above can fail: two modules that import each other are one circle."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("pkg",))
    assert import_circles() == [["pkg.a", "pkg.b"]]


def test_commons_root_holds_only_what_every_layer_uses():
    """Issue 41: common/'s root had grown to 20 loose modules; the rest lives in named sub-packages
    (data, evaluation, io, learning, methods, privacy, secagg)."""
    loose = sorted(p.name for p in (ROOT / "common").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 10, loose


def test_no_module_is_over_400_lines():
    """Small modules (STYLE.md: 90% of Opacus' and Flower's files are under ~400 lines); generated
    protobuf modules aside."""
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in sources(*PACKAGES)
        if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")) and (n := len(p.read_text().splitlines())) > 400
    ]
    assert long == []
