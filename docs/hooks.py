"""MkDocs hook: the documentation's generated parts, rendered from the code at build time.

The CLI reference and the option tables are read from the parsers and the one configuration
dataclass that ``fedgan --help`` prints, so the pages cannot drift from the program. A page asks for
them with a marker on a line of its own:

- ``<!-- fedgan:cli -->``: every ``fedgan`` command's ``--help`` (``simulations.cli.build_parser``);
- ``<!-- fedgan:options WHAT -->``: a table of options, WHAT being a method's ``--strategy`` (its
  section), ``seed`` (the seed stage's section), or field names and prefixes (``dpac_*``).

An unknown marker, method or field fails the build. The figures the measurements wrote under
``bench/results/`` are served at that same path, so pages show them without a copy in ``docs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
FIGURES = "bench/results"
MARKER = re.compile(r"^<!-- fedgan:(?P<kind>[a-z]+)(?P<args>(?: [^ >]+)*) -->$", re.MULTILINE)
HELP_COLUMNS = 100  # argparse wraps to the terminal's width: a fixed one keeps the page stable


def on_files(files, config):
    for figure in sorted((ROOT / FIGURES).glob("*.png")):
        files.append(File.generated(config, f"{FIGURES}/{figure.name}", abs_src_path=str(figure)))
    return files


def on_page_markdown(markdown, page, config, files):
    def render(match: re.Match[str]) -> str:
        kind, args = match["kind"], match["args"].split()
        if kind == "cli" and not args:
            return cli_reference()
        if kind == "options" and args:
            return options_table(args)
        raise PluginError(f"{page.file.src_uri}: unknown marker {match[0]!r}")

    return MARKER.sub(render, markdown)


# ---- the CLI reference ---------------------------------------------------------------------------


@contextmanager
def _columns(width: int) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(the command's words, its one-line help) of every command and subcommand, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield (*words, choice.dest), choice.help or ""
                yield from _commands(action.choices[choice.dest], (*words, choice.dest))


def _subparser(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> argparse.ArgumentParser:
    for word in words:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def cli_reference() -> str:
    from simulations.cli import build_parser

    parser = build_parser()
    with _columns(HELP_COLUMNS):
        parts = ["```text", parser.format_help().rstrip(), "```"]
        for words, summary in _commands(parser):
            anchor = "-".join(words)
            parts += ["", f"## fedgan {' '.join(words)} {{#{anchor}}}", "", _escape(summary), ""]
            parts += ["```text", _subparser(parser, words).format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


# ---- option tables -------------------------------------------------------------------------------


def _section(what: str) -> list[str]:
    """The field names ``what`` names: a method's section, the seed stage's, a field or a prefix."""
    from common.methods import METHODS, ExperimentConfig, seeding

    if what in METHODS:
        return [f.name for f in dataclasses.fields(METHODS[what].options)]
    if what == "seed":
        return [f.name for f in dataclasses.fields(seeding.Options)]
    names = [f.name for f in dataclasses.fields(ExperimentConfig)]
    chosen = [n for n in names if n.startswith(what[:-1])] if what.endswith("*") else [n for n in names if n == what]
    if not chosen:
        raise PluginError(f"fedgan:options {what}: no method, section or option of ExperimentConfig by that name")
    return chosen


def _escape(text: str) -> str:
    """Plain text in a Markdown table cell: no HTML, no emphasis, no column break."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(text, quote=False))


def options_table(whats: list[str]) -> str:
    from common.methods import ExperimentConfig

    fields = {f.name: f for f in dataclasses.fields(ExperimentConfig)}
    rows = ["| flag (TOML and run_config key without the dashes) | default | meaning |", "|---|---|---|"]
    for name in (n for what in whats for n in _section(what)):
        f = fields[name]
        flag = "--" + name.replace("_", "-")
        if f.type in ("bool", bool):
            flag += f"` / `--no-{name.replace('_', '-')}"
        rows.append(f"| `{flag}` | `{f.default!r}` | {_escape(f.metadata['help'])} |")
    return "\n".join(rows) + "\n"
