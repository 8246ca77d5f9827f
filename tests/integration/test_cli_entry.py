"""The ``qveil`` entry point (qveil.cli) as commands see it: a missing bundle creates
nothing, flags a command cannot honour are refused, the help texts, and a command loads only
what it runs (a fresh interpreter). Its in-process behaviour: tests/unit/core/test_cli.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import qveil_main


def test_serve_of_a_missing_bundle_creates_nothing(tmp_path: Path) -> None:
    """`qveil serve --bundle DIR` for a DIR that does not exist says so (exit 2, one line, no
    traceback) and creates no store, beside the missing bundle or anywhere under the working
    directory or QVEIL_HOME."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "qveil.cli", "serve", "--bundle", "nope", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=work,
        env={**os.environ, "QVEIL_HOME": str(home)},
    )
    assert r.returncode == 2, r.stderr
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["work"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--timeout", "-1", "--state", "0.3"], "--timeout must be"),
        (["--card", "--state", "0.3"], "--card takes no --state"),
    ],
)
def test_query_refuses_flags_it_cannot_honour(argv: list[str], says: str) -> None:
    """`qveil query` refuses a non-positive --timeout and a --card with states before it
    dials anything (exit 2, one line), instead of 'Deadline Exceeded' or ignoring a flag."""
    r = qveil_main("query", "--target", "127.0.0.1:9", *argv)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_help_texts_name_every_format_and_flag() -> None:
    """`--help` names Parquet for datasets, the REST binding for serve, and describes
    --max-message-bytes and --metrics-host."""

    def helptext(*argv: str) -> str:
        # in this process, 80 columns wide as in a pipe
        r = qveil_main(*argv, "--help", env={"COLUMNS": "80"})
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.split())

    top = helptext()
    assert "Parquet" in top and ".parquet" in helptext("train")
    serve = helptext("serve")
    assert "REST" in top
    for flag, words in (("--max-message-bytes", "largest request"), ("--metrics-host", "address")):
        assert re.search(re.escape(flag) + r"[^-]*" + words, serve), flag


@pytest.mark.parametrize(
    ("argv", "loaded", "not_loaded"),
    [
        (["--help"], [], ["qveil.server", "qveil.trainer", "qveil.client", "numpy", "grpc"]),
        (
            ["query", "--help"],
            ["qveil.client.commands.query"],
            ["qveil.server", "qveil.trainer", "scipy"],
        ),
        (["budget", "--help"], ["qveil.server.commands.budget"], ["qveil.trainer", "torch"]),
    ],
)
def test_a_command_loads_only_what_it_runs(
    argv: list[str], loaded: list[str], not_loaded: list[str]
) -> None:
    """`qveil --help` imports no command's module (nor numpy or gRPC); `qveil query` imports
    the client alone, not the server, the trainer or scipy (what a caller's machine runs)."""
    code = (
        "import sys\n"
        "from qveil.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('MODULES', ' '.join(sorted(sys.modules)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert r.returncode == 0, r.stderr
    mods = set(r.stdout.rsplit("MODULES", 1)[1].split())
    for m in loaded:
        assert m in mods, m
    for m in not_loaded:
        assert not any(x == m or x.startswith(m + ".") for x in mods), m
