"""The ``qveil`` entry point (qveil.cli): ``qveil --help`` names fqi as the default release,
in its description and in the train subcommand's one-line help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qveil.cli import main


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
