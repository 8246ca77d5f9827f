"""What every fqi config shares (qveil.fqi_config): reading the TOML table (a missing or
malformed file refused), a config dataclass from a table (unknown keys and another mode
refused), writing it back as TOML, and the noise-to-value and clipping messages."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.fqi_config import (
    CLIP_REFUSE,
    REFUSE_RATIO,
    WARN_RATIO,
    clipping_message,
    config_from_dict,
    config_toml,
    ratio_message,
    read_toml,
    toml_value,
)


@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str = "x"
    n: int = 1
    rate: float = 0.5
    on: bool = False
    pairs: tuple[tuple[float, float], ...] | None = None


def test_read_toml(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('mode = "fqi"\nn = 3\n')
    assert read_toml(f) == {"mode": "fqi", "n": 3}
    with pytest.raises(InvalidArgument, match=r"^config '.*nope.toml' does not exist$"):
        read_toml(tmp_path / "nope.toml")
    f.write_text("n = = 3\n")
    with pytest.raises(InvalidArgument, match=r"c.toml' is not valid TOML: "):
        read_toml(f)


def test_config_from_dict() -> None:
    assert config_from_dict(Cfg, {"mode": "fqi", "n": 4}, "test") == Cfg(n=4)
    assert config_from_dict(Cfg, {}, "test") == Cfg()
    with pytest.raises(InvalidArgument, match=r"^unknown test config key\(s\): a, b$"):
        config_from_dict(Cfg, {"b": 1, "a": 2, "n": 1}, "test")
    with pytest.raises(InvalidArgument, match=r"^this config is for mode 'paper', not fqi$"):
        config_from_dict(Cfg, {"mode": "paper"}, "test")


@pytest.mark.parametrize(
    ("value", "toml"),
    [
        ("a", '"a"'),
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (np.float64(0.1), "0.1"),
        (2.0, "2.0"),
        (((0.0, 1.0), [2, 3]), "[[0.0, 1.0], [2, 3]]"),
    ],
)
def test_toml_value(value: object, toml: str) -> None:
    assert toml_value(value) == toml
    assert tomllib.loads(f"v = {toml}")["v"] == tomllib.loads(f"v = {toml_value(value)}")["v"]


def test_config_toml_round_trips_every_set_field() -> None:
    cfg = Cfg(name="lw", n=7, rate=0.25, on=True, pairs=((0.0, 1.0), (-2.0, 2.5)))
    text = config_toml(cfg, "a header")
    assert text.startswith('# a header\nmode = "fqi"\n')
    table = tomllib.loads(text)
    table["pairs"] = tuple(tuple(p) for p in table["pairs"])
    assert config_from_dict(Cfg, table, "test") == cfg
    assert "pairs" not in config_toml(Cfg(), "h")  # an unset (None) field is left out


def test_ratio_message() -> None:
    def result(ratio: float) -> SimpleNamespace:
        return SimpleNamespace(sigma=2.0 * ratio, noise_to_value=ratio)

    assert ratio_message(result(WARN_RATIO)) is None
    large = ratio_message(result(0.8))
    assert large is not None and large.startswith("sigma = 1.6 is 0.80 x the value scale")
    assert "r0/(1-gamma) = 2:" in large and "a large part of the values" in large
    worse = ratio_message(result(REFUSE_RATIO + 0.5))
    assert worse is not None and "WORSE THAN A RANDOM POLICY" in worse


def test_clipping_message() -> None:
    line = clipping_message(3, 200, ((0.0, 1.0),))
    assert line == (
        "3 of 200 rows (1.50 %) have a state or next state outside the config's "
        "state_intervals [[0.0, 1.0]] and are clipped into them"
    )
    many = clipping_message(int(CLIP_REFUSE * 100) + 1, 100, [[0.0, 1.0]])
    assert many.endswith("the intervals do not describe the data (wrong units, another env, a "
                         "stale config?)")  # fmt: skip
    assert clipping_message(0, 0, [[0, 1]]).startswith("0 of 0 rows (0.00 %)")
