"""scripts/demo.sh (`make demo`) as written: it prints the basis of the guarantee once (on
the card, not in the privacy plan too) and ends on the one-line summary of the returns that
`qveil evaluate` prints last (tests/integration/test_cli_evaluate.py checks that line on a
real server; the whole demo takes about a minute, so it is run by `make demo`, not here)."""

from __future__ import annotations

import re
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.sh"


def commands(text: str) -> list[str]:
    """The script's command lines, continuations joined, comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.split("  #", 1)[0].rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1]
            continue
        out.append(" ".join((buf + line).split()))
        buf = ""
    return out


def test_the_basis_is_printed_once_by_the_card() -> None:
    cmds = commands(DEMO.read_text())
    (plan,) = [c for c in cmds if c.startswith('"$QVEIL" privacy ')]
    assert plan.endswith("| grep -v '^basis '"), plan
    assert [c for c in cmds if c.startswith('"$QVEIL" query') and "--card" in c]


def test_the_demo_ends_on_the_returns_in_one_line() -> None:
    cmds = commands(DEMO.read_text())
    (evaluate,) = [c for c in cmds if c.startswith('"$QVEIL" evaluate ')]
    m = re.search(r'>"(\$OUT/[\w.]+)"$', evaluate)
    assert m, evaluate
    assert f'head -n -1 "{m.group(1)}"' in cmds  # the table, without its last line
    assert cmds[-1] == f'tail -n 1 "{m.group(1)}"', cmds[-3:]  # the summary, last
