"""The ``qveil`` entry point (qveil.cli), in this process: ``qveil --help`` names fqi as the
default release; the listed help lines are the commands' own; the subcommand of a command
line; the wiring of a run function; an unavailable command's message; the exit codes."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import qveil_main

from qveil import cli
from qveil.cli import SUBCOMMANDS, WIRING, build_parser, main, provided, run
from qveil.errors import FailedPrecondition


def test_help_names_fqi_as_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width
    assert "The default release is fqi" in out
    train = re.search(r" train (.*?) evaluate ", out)
    assert train is not None, out
    assert "fqi" in train.group(1) and "default" in train.group(1), train.group(1)
    assert "Algorithm 1" in train.group(1)  # still reachable, named as the other choice


def test_the_listed_help_lines_are_the_commands_own() -> None:
    """`qveil --help` lists every command by the help line in qveil.cli.SUBCOMMANDS without
    importing its module; each line must be the one the module registers."""
    full = build_parser()
    (sub,) = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    own = {a.dest: a.help for a in sub._choices_actions}
    assert own == {name: line for name, (_module, line) in SUBCOMMANDS.items()}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["noise", "--seed", "1"], "noise"),
        (["--version", "privacy"], "privacy"),
        (["--x", "nosuch", "noise"], None),  # the first word that is no option decides
        ([], None),
    ],
)
def test_the_command_a_line_names(argv: list[str], command: str | None) -> None:
    assert cli._command(argv) == command


def test_the_wiring_names_real_run_functions_and_providers() -> None:
    for func, kwargs in WIRING.items():
        module, name = func.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), name)), func
        for spec in kwargs.values():
            mod, attr = spec.split(":")
            assert callable(getattr(importlib.import_module(mod), attr)), spec


def test_run_passes_the_wired_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    def command(args: argparse.Namespace, *, helper: object) -> int:
        assert callable(helper)
        return int(helper("3"))  # type: ignore[operator]

    key = f"{command.__module__}.{command.__qualname__}"
    monkeypatch.setitem(WIRING, key, {"helper": "builtins:int"})
    assert run(argparse.Namespace(func=command)) == 3
    assert run(argparse.Namespace(func=lambda args: None)) == 0  # None is exit 0


def test_provided_names_a_missing_extra() -> None:
    call = provided("qveil_no_such_module_xyz:f")  # nothing imported until it is called
    with pytest.raises(FailedPrecondition, match=r"needs 'qveil_no_such_module_xyz'.*extras"):
        call()


@pytest.fixture
def fake_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two commands of modules in tmp_path: `boom` (raises what --raise names) and `broken`
    (its module needs a package that is not installed)."""
    (tmp_path / "qveil_test_boom.py").write_text(
        textwrap.dedent(
            """
            from qveil.cli_parser import add_command
            from qveil.errors import InvalidArgument

            def run(args):
                if args.raise_ == "invalid":
                    raise InvalidArgument("the value is bad")
                if args.raise_ == "interrupt":
                    raise KeyboardInterrupt
                return 5

            def add_parser(sub):
                p = add_command(sub, "boom", "boom", None, run=run)
                p.add_argument("--raise", dest="raise_", default="")
            """
        )
    )
    (tmp_path / "qveil_test_broken.py").write_text("import qveil_test_not_installed_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SUBCOMMANDS, "boom", ("qveil_test_boom", "boom"))
    monkeypatch.setitem(SUBCOMMANDS, "broken", ("qveil_test_broken", "broken"))
    monkeypatch.setitem(SUBCOMMANDS, "absent", ("qveil_test_absent_module", "absent"))
    yield
    for m in ("qveil_test_boom", "qveil_test_broken"):
        sys.modules.pop(m, None)


@pytest.mark.usefixtures("fake_commands")
def test_exit_codes_and_the_one_line_error() -> None:
    assert qveil_main("boom").returncode == 5
    r = qveil_main("boom", "--raise", "invalid")
    assert (r.returncode, r.stderr) == (2, "qveil boom: error: the value is bad\n")
    assert qveil_main("boom", "--raise", "interrupt").returncode == 130
    r = qveil_main("boom", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


@pytest.mark.usefixtures("fake_commands")
def test_an_unavailable_command_names_the_missing_package() -> None:
    r = qveil_main("broken", "--any", "arguments")
    assert r.returncode == 2
    assert r.stderr == (
        "qveil broken: needs 'qveil_test_not_installed_pkg'; install qveil with its extras "
        "(pip install 'qveil[server,trainer]')\n"
    )
    # a command whose own module is absent is left out; the others still parse
    parser = build_parser(["absent"])
    with pytest.raises(SystemExit):
        parser.parse_args(["absent"])
    assert build_parser(["boom"]).parse_args(["boom"]).func is not None
