"""What every `fqi` config file shares: reading the TOML table, writing a config back as
TOML, and the noise-to-value thresholds a release plan is judged by
(:mod:`qveil.kfqi_config` is the config itself). No torch, no gymnasium: the client's CLI
imports it.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar  # Any: TOMLTable

from qveil.errors import InvalidArgument, echo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C")
#: A TOML table as :mod:`tomllib` types it: its values are any TOML value (string, number,
#: bool, date, array, table), read by the config dataclass that takes them.
TOMLTable: TypeAlias = dict[str, Any]  # tomllib.load returns dict[str, Any] (any TOML value)

__all__ = [
    "CLIP_REFUSE",
    "CLIP_WARN",
    "REFUSE_RATIO",
    "WARN_RATIO",
    "clipping_message",
    "config_toml",
    "ratio_message",
    "read_toml",
    "toml_value",
    "TOMLTable",
]

#: sigma / (r0 / (1 - gamma)) above this: a warning (the noise is a large part of the values).
WARN_RATIO = 0.5
#: ... above this: refused unless forced (expected worse than a random policy).
REFUSE_RATIO = 1.0
#: Rows whose state or next state lies outside the config's state intervals (clipped into
#: them), as a fraction of all rows: above CLIP_WARN a warning...
CLIP_WARN = 0.01
#: ... above CLIP_REFUSE a refusal unless --allow-clipping (the intervals do not describe
#: the data: wrong units, another env, a stale config). The shipped CartPole and LunarLander
#: configs clip 6 to 8 % of random-policy rows by design (each coordinate's interval is its
#: 1 % / 99 % quantiles, over d coordinates of s and s2), well below it.
CLIP_REFUSE = 0.25


def read_toml(path: str | Path) -> TOMLTable:
    """A config file's table; a missing or malformed file is InvalidArgument."""
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"config {echo(path)} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config {echo(path)} is not valid TOML: {exc}") from None


def config_from_dict(cls: type[C], d: Mapping[str, object], what: str) -> C:
    """A config dataclass from a mapping of its fields (and ``mode = "fqi"``): an unknown key
    or another mode is InvalidArgument. ``what`` names the config kind in the message."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names - {"mode"})
    if unknown:
        raise InvalidArgument(f"unknown {what} config key(s): {', '.join(unknown)[:80]}")
    if d.get("mode", "fqi") != "fqi":
        raise InvalidArgument(f"this config is for mode {d['mode']!r:.80}, not fqi")
    return cls(**{k: v for k, v in d.items() if k != "mode"})


def toml_value(v: object) -> str:
    """A config value as TOML: strings quoted, tuples and lists (nested) as arrays."""
    if isinstance(v, tuple | list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    # a number: numpy floats too (their repr is not TOML)
    return repr(float(v))  # type: ignore[arg-type]


def config_toml(cfg: DataclassInstance, header: str) -> str:
    """Every set field of a config dataclass as TOML (round-trips through its from_toml)."""
    lines = [f"# {header}", 'mode = "fqi"']
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v is not None:
            lines.append(f"{f.name} = {toml_value(v)}")
    return "\n".join(lines) + "\n"


class _NoiseRatio(Protocol):
    """What :func:`ratio_message` reads of an accountant's result."""

    @property
    def sigma(self) -> float: ...

    @property
    def noise_to_value(self) -> float: ...


def ratio_message(result: _NoiseRatio) -> str | None:
    """The warning for a noise-to-value ratio above :data:`WARN_RATIO` (None below it)."""
    r = float(result.noise_to_value)
    if r <= WARN_RATIO:
        return None
    scale = result.sigma / r
    return (
        f"sigma = {result.sigma:.4g} is {r:.2f} x the value scale r0/(1-gamma) = {scale:.4g}: "
        + (
            "the release is expected to be WORSE THAN A RANDOM POLICY"
            if r > REFUSE_RATIO
            else "the noise is a large part of the values; expect a poor policy"
        )
        + " (more users, a larger epsilon, or a smaller gamma would help)"
    )


def clipping_message(clipped: int, samples: int, intervals: Sequence[Sequence[float]]) -> str:
    """The report of the rows clipped into the state intervals ``intervals`` (one line)."""
    share = clipped / max(1, samples)
    line = (
        f"{clipped} of {samples} rows ({100 * share:.2f} %) have a state or next state "
        f"outside the config's state_intervals {[list(p) for p in intervals]} and are "
        "clipped into them"
    )
    if share > CLIP_REFUSE:
        return line + (
            f"; above {100 * CLIP_REFUSE:g} % the intervals do not describe the data (wrong "
            "units, another env, a stale config?)"
        )
    return line
