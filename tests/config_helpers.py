"""Training configurations for tests: the shipped configs, shrunk to train in about a second."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: The d = 4 kernel fqi config (CartPole) and its beta_j (a card and a store must carry these,
#: whatever they are).
CARTPOLE_CONFIG = str(REPO / "configs" / "cartpole-private.toml")
CARTPOLE_BETAS = [float(b) for b in tomllib.loads(Path(CARTPOLE_CONFIG).read_text())["betas"]]

#: configs/linewalk-quick.toml's keys set smaller (100 samples).
TINY = {"samples": "100", "batch_size": "16", "replay_capacity": "100", "resets": "2"}


def tiny_linewalk_config(directory: Path) -> Path:
    """configs/linewalk-quick.toml shrunk to 100 samples, written as ``directory/tiny.toml``.
    Run it in gdp mode at sigma = 1 (paper mode's Theorem 5 does not hold at these
    settings)."""
    lines = []
    for line in (REPO / "configs" / "linewalk-quick.toml").read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(f"{key} = {TINY[key]}" if key in TINY else line)
    p = directory / "tiny.toml"
    p.write_text("\n".join(lines) + "\n")
    return p
