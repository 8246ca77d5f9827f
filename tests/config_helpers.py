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


#: A small 3-action, 2-coordinate kernel fqi config: MountainCar-v0 (reward -1 per step,
#: declared [-1, 0]), gamma 0.99 (the Q range [-100, 0]) and its pessimistic end as the
#: default. Random-policy episodes never reach the goal, so every reward is -1: the data
#: cannot support any policy better than random.
MOUNTAINCAR_CONFIG = """\
mode = "fqi"
estimator = "kernel"
env_id = "MountainCar-v0"
state_intervals = [[-1.2, 0.6], [-0.07, 0.07]]
reward_range = [-1.0, 0.0]
gamma = 0.99
iterations = 5
anchor_points = 5
bandwidth = 0.25
lam = 0.2
betas = [2.0, 2.0]
default_value = -100.0
"""


def mountaincar_config(directory: Path, name: str = "mountaincar", **changes: str) -> Path:
    """:data:`MOUNTAINCAR_CONFIG` (``changes``: keys set to these TOML values, or removed
    when the value is empty) written as ``directory/<name>.toml``."""
    lines, keys = [], set()
    for line in MOUNTAINCAR_CONFIG.splitlines():
        key = line.split("=", 1)[0].strip()
        keys.add(key)
        if key not in changes:
            lines.append(line)
        elif changes[key]:
            lines.append(f"{key} = {changes[key]}")
    lines += [f"{k} = {v}" for k, v in changes.items() if v and k not in keys]
    p = directory / f"{name}.toml"
    p.write_text("\n".join(lines) + "\n")
    return p
