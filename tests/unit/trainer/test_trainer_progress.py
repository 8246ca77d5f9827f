"""Progress on stderr (qveil.trainer.progress): off a terminal, a line per tenth of the work
(or every few seconds) and always at the end; nothing when disabled."""

from __future__ import annotations

import re

import pytest

from qveil.trainer import progress as progress_module
from qveil.trainer.progress import progress


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln]


def test_off_a_terminal_a_line_per_tenth_and_at_the_end(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 1e9)  # the fraction rule alone
    # pytest's captured stderr is no terminal, as a log file or a CI job's
    with progress(25, desc="collect", unit="users", enabled=True) as bar:
        for _ in range(25):
            bar.update()
    lines = _lines(capsys.readouterr().err)
    assert all(re.fullmatch(r"collect: users \d+/25 done \(\d+ s\)", ln) for ln in lines)
    done = [int(ln.split()[2].split("/")[0]) for ln in lines]
    # a line when 2.5 more are done (rounded up to whole updates), and at 25
    assert done == [3, 6, 9, 12, 15, 18, 21, 24, 25]


def test_a_large_update_and_the_time_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with progress(1000, desc="fit", unit="shards", enabled=True) as bar:
        bar.update(1000)
    (line,) = _lines(capsys.readouterr().err)
    assert re.fullmatch(r"fit: shards 1000/1000 done \(\d+ s\)", line)
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 0.0)  # every update is "late"
    with progress(1000, desc="fit", unit="shards", enabled=True) as bar:
        bar.update()
        bar.update()
    assert len(_lines(capsys.readouterr().err)) == 2


def test_disabled_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress(10, desc="x", unit="u", enabled=False) as bar:
        for _ in range(10):
            bar.update()
    assert capsys.readouterr().err == ""
