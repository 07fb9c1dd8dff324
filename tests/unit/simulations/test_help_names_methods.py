"""Every help text that lists methods lists them from the registry (issue 43, item 2): a hand-written
list drifted ("for methods that support it: dp-merf" while three did; "gswgan, dp-merf: per-client"
without dp-ntk). Each list of two or more method names in any command's help must be one of the sets
the registry defines, and the options that name every method name every one."""

from __future__ import annotations

import argparse
import re

import pytest

from common.channels import SUMS
from common.methods import METHODS
from simulations.cli import build_parser

NAMES = sorted(METHODS, key=len, reverse=True)  # longest first: "dp-merf" before "dpgan"
NAME = "(?:" + "|".join(re.escape(n) for n in NAMES) + ")"
LIST = re.compile(rf"(?<![\w-]){NAME}(?:(?:, | and |, and ){NAME})+(?![\w-])")
# What the registry says of each method, the sets a help text may list
SETS = {
    "every method": set(METHODS),
    "seeds a GAN": {n for n, m in METHODS.items() if m.seeds},
    "starts from a seed": {n for n, m in METHODS.items() if m.accepts_seed},
    "sums": {n for n, m in METHODS.items() if SUMS in m.channel_needs},
    "DPAC": {n for n, m in METHODS.items() if m.supports_dpac},
}


def help_texts() -> list[tuple[str, str, str]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return [
        (command, (action.option_strings or [action.dest])[0], " ".join((action.help or "").split()))
        for command, sub in commands.items()
        for action in sub._actions
    ]


def test_every_list_of_methods_in_a_help_text_is_a_registry_set():
    for command, flag, text in help_texts():
        for found in LIST.finditer(text):
            listed = set(re.findall(NAME, found.group(0)))
            assert listed in SETS.values(), f"fedgan {command} {flag}: {found.group(0)!r} is no registry set"


@pytest.mark.parametrize("flag", ["--strategy", "--target-epsilon"])
def test_the_options_about_every_method_name_each_one(flag):
    for command, name, text in help_texts():
        if name == flag:
            assert all(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text) for n in METHODS), (command, text)


def test_the_seed_options_name_the_seeding_and_the_seeded_methods():
    text = next(text for _, flag, text in help_texts() if flag == "--init-release")
    assert ", ".join(n for n in METHODS if n in SETS["seeds a GAN"]) in text
    assert ", ".join(n for n in METHODS if n in SETS["starts from a seed"]) in text
