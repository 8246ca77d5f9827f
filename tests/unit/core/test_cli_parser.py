"""How a command is declared (qveil.cli_parser): its --help shows the module docstring as
written, it runs the function given, and the shared --no-progress flag."""

from __future__ import annotations

import argparse

import pytest

from qveil.cli_parser import add_command, add_no_progress

DOC = """First line.

    an indented block
    kept as written
"""


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    top = argparse.ArgumentParser(prog="qveil")
    sub = top.add_subparsers(dest="command", required=True)
    cmd = add_command(sub, "thing", "do the thing", DOC, run=lambda args: 7, aliases=["t"])
    add_no_progress(cmd)
    return top, cmd


def test_help_shows_the_docstring_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    top, cmd = _parser()
    with pytest.raises(SystemExit) as exc:
        top.parse_args(["thing", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "    an indented block\n    kept as written\n" in out
    assert "--no-progress" in out
    assert cmd.description == DOC


def test_the_command_runs_its_function_and_takes_add_parser_keywords() -> None:
    top, _ = _parser()
    args = top.parse_args(["t"])  # the alias passed through to add_parser
    assert args.func(args) == 7 and args.no_progress is False
    assert top.parse_args(["thing", "--no-progress"]).no_progress is True


def test_a_command_without_run_has_no_func() -> None:
    top = argparse.ArgumentParser()
    sub = top.add_subparsers(dest="command")
    add_command(sub, "group", "a group", None)
    assert not hasattr(top.parse_args(["group"]), "func")


def test_no_progress_on_an_argument_group() -> None:
    p = argparse.ArgumentParser()
    add_no_progress(p.add_argument_group("output"))
    assert p.parse_args(["--no-progress"]).no_progress is True
    with pytest.raises(SystemExit):
        p.parse_args(["--no-progress=1"])
