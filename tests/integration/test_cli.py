"""The ``qveil`` entry point (qveil.cli): ``qveil --help`` names fqi as the default release,
in its description and in the train subcommand's one-line help."""

from __future__ import annotations

import re

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
