"""Helpers for the CLI tests: the one-line usage error every command gives on bad input, the
token files a command must refuse that way, and the CLI's entry point run in this process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

from qveil.cli import main


def assert_one_line_error(r: subprocess.CompletedProcess[str], command: str, *words: str) -> None:
    """Exit 2 and a single stderr line ``qveil <command>: error: ...`` naming every word."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qveil {command}: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def bad_token_files(d: Path) -> list[tuple[Path, tuple[str, ...]]]:
    """Token files that cannot serve, made in ``d``, each with the words its error names:
    missing, a directory, not UTF-8, empty."""
    latin1 = d / "latin1.tok"
    latin1.write_bytes(b"\xff\xfetoken")
    empty = d / "empty.tok"
    empty.write_text("  \n")
    return [
        (d / "missing.tok", ("missing.tok", "cannot be read")),
        (d, ("cannot be read",)),  # a directory
        (latin1, ("latin1.tok", "not UTF-8")),
        (empty, ("empty",)),
    ]


def qveil_main(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``qveil ARGV`` through the CLI's entry point (:func:`qveil.cli.main`) in this process,
    as a finished process: its exit code and what it wrote on stdout and stderr. The same
    code as the real command without a new interpreter's start-up (about a second): for the
    variations of a command (refusals, flags) whose documented form a real-subprocess test
    runs. ``cwd`` and ``env`` (variables set on top of this process's) hold for the call
    only, and the process umask the CLI sets is restored."""
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    umask = os.umask(0o077)
    os.umask(umask)
    try:
        os.environ.update(env or {})
        with (
            contextlib.chdir(cwd or Path.cwd()),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors (exit 2)
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.umask(umask)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["qveil", *argv], code, out.getvalue(), err.getvalue())
