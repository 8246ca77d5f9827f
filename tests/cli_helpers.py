"""Helpers for the CLI tests: the one-line usage error every command gives on bad input, and
the token files a command must refuse that way."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
