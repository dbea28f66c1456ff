"""`hvdtrain --help` lists every subcommand with a one-line summary, not a raw usage string (issue 41): the
summary is the first sentence after the module docstring's "`hvdtrain NAME ...`: ", even where that usage
runs over several lines (ray's did, and `--help` showed it with an unclosed backtick)."""
from __future__ import annotations

import argparse

import hvdtrain.cli
from hvdtrain.cli.args import Parser, command_parser
from hvdtrain.cli.main import SUBCOMMANDS, parser


def summaries() -> dict[str, str]:
    [commands] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help for choice in commands._choices_actions}


def test_every_subcommand_has_a_one_sentence_summary() -> None:
    found = summaries()
    assert list(found) == list(SUBCOMMANDS)
    for name, summary in found.items():
        assert summary.count("`") % 2 == 0, (name, summary)
        assert not summary.startswith(("`", "hvdtrain")), (name, summary)
        assert summary.endswith(".") and ". " not in summary and "\n" not in summary, (name, summary)


def test_a_usage_over_two_lines_still_gives_its_summary() -> None:
    doc = ("`hvdtrain x [--a A] [--b B]\n[--key value ...]`: train somewhere, one worker each. With `--c` more.\n\n"
           "Details.")
    commands = argparse.ArgumentParser().add_subparsers(parser_class=Parser)
    command_parser(commands, "x", doc)
    assert commands._choices_actions[0].help == "train somewhere, one worker each."


def test_the_help_lists_them_all_and_the_package_docstring_names_them_all() -> None:
    text = parser().format_help()
    for name in SUBCOMMANDS:
        assert f"    {name} " in text, name
        assert name in hvdtrain.cli.__doc__, name
    assert "`hvdtrain ray [" not in text
