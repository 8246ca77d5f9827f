"""Shared by the benchmark scripts: a machine line, the load average, a Markdown table, a
log-log figure saved as PNG, and writing one named section of docs/benchmarks.md in place
(each script owns its section between markers)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. ``1.2, 0.9, 0.8``."""
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def load_line() -> str:
    """The paragraph that opens a section: the load average at the end of the run."""
    return (
        f"Load average at the end of the run: {load_average()} (2 cores shared with other "
        "work).\n\n"
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


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots`` on the file-only Agg backend: (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def log_axes(ax: Any, *, xlabel: str, ylabel: str, title: str, fontsize: int = 8) -> None:
    """Log scales on both axes, the labels and title, and a legend."""
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=fontsize)


def save_figure(fig: Any, path: Path, dpi: float = 110) -> None:
    """Lay ``fig`` out, write it to ``path`` (its folder made if missing) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def emit(sections: Sequence[tuple[str, str, str, str]], no_write: bool) -> None:
    """Write each (name, title, command, body) section, or only print its body."""
    for name, title, command, body in sections:
        if no_write:
            print(body)
        else:
            write_section(name, title, command, body)
