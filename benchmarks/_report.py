"""Shared by the benchmark scripts: a machine line, a Markdown table, and writing one named
section of docs/benchmarks.md in place (each script owns its section between markers)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Every table below is written by a script in `benchmarks/`; rerun it with the command "
    "shown under its heading. The machine is noisy (+-10 to 25 %): compare ratios within one "
    "run, not absolute numbers across runs.\n"
)


def machine_line() -> str:
    """One line naming the machine the numbers come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=DOC.parent,
        ).stdout.strip()
    except OSError:
        rev = "?"
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, commit {rev or '?'}"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats get 4 significant digits."""

    def fmt(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def write_section(name: str, title: str, command: str, body: str) -> None:
    """Replace (or append) the section ``name`` of docs/benchmarks.md and print it."""
    block = (
        f"<!-- BEGIN {name} -->\n## {title}\n\n`{command}`\n\n"
        f"Machine: {machine_line()}\n\n{body.strip()}\n<!-- END {name} -->"
    )
    print(block)
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else HEADER
    pat = re.compile(rf"<!-- BEGIN {re.escape(name)} -->.*?<!-- END {re.escape(name)} -->", re.S)
    text = pat.sub(lambda _m: block, text) if pat.search(text) else text.rstrip() + "\n\n" + block
    DOC.write_text(text.rstrip() + "\n")
