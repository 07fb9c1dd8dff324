"""The documentation's generated parts (docs/hooks.py) cover every command and every method.

`make test` builds the site with --strict, which catches broken links and pages left out of the nav;
these catch what the build cannot: a command or a method that has no place in the pages.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from common.methods import METHODS
from simulations.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_holds_every_commands_help(hooks) -> None:
    parser = build_parser()
    reference = hooks.cli_reference()
    commands = [words for words, _ in hooks._commands(parser)]
    assert ("simulate",) in commands and ("data", "download") in commands
    with hooks._columns(hooks.HELP_COLUMNS):
        for words in commands:
            assert f"## fedgan {' '.join(words)} " in reference
            assert hooks._subparser(parser, words).format_help().rstrip() in reference


def test_every_method_has_a_page_in_the_nav_with_its_options(hooks) -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in METHODS:
        page = ROOT / "docs" / "methods" / f"{name}.md"
        assert f"<!-- fedgan:options {name} -->" in page.read_text(), page
        assert f"methods/{name}.md" in nav
        assert "`--" + hooks._section(name)[0].replace("_", "-") + "`" in hooks.options_table([name])


def test_an_option_table_escapes_markdown_and_refuses_unknown_names(hooks) -> None:
    table = hooks.options_table(["ntk_width"])
    assert "m\\*(d+1)+1" in table and table.count("\n") == 3
    with pytest.raises(hooks.PluginError, match="no_such"):
        hooks.options_table(["no_such_*"])
