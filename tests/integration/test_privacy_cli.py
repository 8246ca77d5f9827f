"""`qveil privacy` through the installed entry point, in a real process (its flags and
output in this process: tests/unit/core/test_commands_privacy.py)."""

from __future__ import annotations

import subprocess
import sys


def test_no_sigma_and_no_epsilon_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qveil.cli", "privacy"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--sigma --epsilon is required" in proc.stderr
