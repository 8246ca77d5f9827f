"""The training configuration: one frozen, keyword-only dataclass, loaded from TOML.

Every field has a docstring (the string under it) that says what it is and, for the paper's
symbols, which one (T, B, alpha, gamma, k, L, J). ``TrainConfig.from_toml`` reads a file with
:mod:`tomllib`; :func:`to_toml` writes the effective configuration back (saved into every
release bundle as ``config.toml``). :meth:`TrainConfig.validate` checks everything that can
be checked without building the environment and raises :class:`qveil.errors.InvalidArgument`
naming the bad field and value.

Two training recipes share one code path (``qveil.trainer.algorithm``):

* literal Algorithm 1 (``replay = false``): T/B iterations; each collects B fresh samples
  and takes one plain SGD step at rate alpha on their batch-mean loss.
* the authors' recipe (``replay = true``; ``wangbx66/differentially-private-q-learning``,
  dpql.py): one iteration per environment step, a replay memory, ``updates_per_step``
  updates per step on batches of B drawn from it, optionally a target network, RMSprop,
  Huber loss, gradient clamping and epsilon-greedy decay.

An *iteration* is what the noise reset schedule counts: the J sample paths are reset every
``iterations / J`` iterations (Algorithm 1 line 7, ``j = 0 mod T/(JB)``), so J must divide
the number of iterations (T // B literal, T with replay).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any  # Any: replace's changes, as dataclasses.replace types them

from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject

__all__ = ["MODES", "OPTIMIZERS", "TrainConfig", "load_config", "to_toml"]

MODES = ("paper", "gdp", "output")
OPTIMIZERS = ("sgd", "rmsprop", "adam")
LOSSES = ("mse", "huber")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that determines a training run (the privacy parameters included)."""

    env_id: str = "qveil/LineWalk-v0"
    """Gymnasium id of the environment; it must have a bounded 1-D Box observation and
    Discrete actions (the state interval is read from the observation space)."""

    env_kwargs: JSONObject = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make`` (e.g. ``episode_length`` for LineWalk)."""

    samples: int = 5000
    """T: environment steps (samples) the agent trains on (paper: 5000 = 100 episodes)."""

    batch_size: int = 64
    """B: samples per SGD update (paper: 64; the authors' code: 128)."""

    lr: float = 3e-4
    """alpha: learning rate (step size) of every update (paper: 3e-4)."""

    gamma: float = 0.999
    """Discount factor (the authors' code: 0.999). Output mode clamps |Q| to r0/(1-gamma)."""

    k: float = 23.0
    """k: the bound on |g| that Theorem 5's analysis assumes (paper E.3: 23); the number of
    training noise values with |g| > k is counted and reported on the card."""

    lipschitz: float = 4.0
    """L: Lipschitz bound of each Q(., a) with respect to the UNIT state x in [0, 1] (the
    noise domain where beta is defined), enforced by the network's construction (paper: L^2 =
    16). A state interval [lo, hi] means a bound L / (hi - lo) in the raw state."""

    resets: int = 78
    """J: number of noise sample paths; all m paths are reset every iterations / J
    iterations (paper E.3: J = floor(T/B) = 78, a new path every iteration)."""

    hidden: tuple[int, ...] = (16, 16)
    """Widths of the hidden layers of the MLP (ReLU between layers; the authors: 16, 16)."""

    reward_range: tuple[float, float] = (0.0, 0.5)
    """Declared reward range [r_min, r_max]; every reward is clipped into it. The reward bound
    r0 of the accountant is max(|r_min|, |r_max|) (LineWalk: [0, 0.5])."""

    truncation_as_terminal: bool = True
    """Treat a time-limit truncation as terminal (no bootstrap), as the authors' code does."""

    replay: bool = False
    """False: literal Algorithm 1 (each batch = the last B samples, used once). True: the
    authors' recipe, one iteration per environment step with a replay memory."""

    replay_capacity: int = 10000
    """Replay memory size (replay only; the authors: 10000)."""

    learning_starts: int = 0
    """Replay only: updates begin once the memory holds this many samples (0 means B)."""

    updates_per_step: int = 1
    """Replay only: updates per environment step (the authors: 1)."""

    target_update_episodes: int = 0
    """Copy the network into a target network every this many episodes; 0 = no target
    network, targets use the current network as in Algorithm 1 (the authors: 10)."""

    optimizer: str = "sgd"
    """"sgd" (plain SGD at rate alpha, as Theorem 5 assumes), "rmsprop" (the authors) or
    "adam". An adaptive optimizer leaves the theorem: paper/gdp cards then say holds=false."""

    loss: str = "mse"
    """"mse": the paper's 1/2 (Q + g - y)^2; "huber": smooth L1 (the authors)."""

    grad_clamp: float = 0.0
    """Clamp each gradient coordinate to [-c, c] before the step; 0 = off (the authors: 1)."""

    eps_start: float = 0.0
    """Epsilon-greedy exploration at step 0 (0 = the paper's pure noisy-greedy selection).
    Exploration ignores rewards, so it is post-processing for privacy."""

    eps_end: float = 0.0
    """Epsilon-greedy floor (the authors: 0.05)."""

    eps_decay: float = 200.0
    """Epsilon decays as eps_end + (eps_start - eps_end) exp(-step / eps_decay) (authors: 200)."""

    mode: str = "paper"
    """Accounting mode: "paper" (Theorem 5 as stated), "gdp" (same sensitivity, exact
    Gaussian-DP composition), "output" (one GP mechanism at release on the clamped,
    Lipschitz network; training itself then runs with sigma = 0)."""

    sigma: float | None = None
    """Noise scale. Give either sigma or epsilon (the CLI's --sigma / --epsilon override)."""

    epsilon: float | None = None
    """Target epsilon: sigma is calibrated by the accountant (qveil.privacy.calibrate)."""

    delta: float = 1e-4
    """delta of the guarantee (paper: 1e-4)."""

    reward_sensitivity: float = 1.0
    """Scale of neighbouring reward functions, ||r - r'||_inf <= this (paper: 1)."""

    calibrate_k: bool = True
    """With a target epsilon in paper/gdp mode, let the accountant pick the smallest k whose
    Lemma 8 term fits in delta (Appendix E.3's procedure; the card then shows that k);
    false keeps ``k`` as configured."""

    # ------------------------------------------------------------------ derived values
    @property
    def reward_bound(self) -> float:
        """r0 = max(|r_min|, |r_max|)."""
        return max(abs(self.reward_range[0]), abs(self.reward_range[1]))

    @property
    def effective_learning_starts(self) -> int:
        return self.learning_starts or self.batch_size

    @property
    def iterations(self) -> int:
        """Iterations the reset schedule counts: T // B (literal) or T (replay)."""
        return self.samples if self.replay else self.samples // self.batch_size

    @property
    def reset_period(self) -> int:
        """Iterations between noise resets: iterations / J."""
        return self.iterations // self.resets

    @property
    def planned_updates(self) -> int:
        """Parameter updates the run takes (the accountant's ``steps``), known in advance."""
        if not self.replay:
            return self.samples // self.batch_size
        first = self.effective_learning_starts  # memory size after step i is i + 1
        return max(0, self.samples - first + 1) * self.updates_per_step

    @property
    def plain_sgd(self) -> bool:
        """True when every update is plain SGD at rate alpha on the paper's squared loss."""
        return not self.sgd_deviations()

    def sgd_deviations(self) -> list[str]:
        """Why the updates are not Theorem 5's plain SGD step (empty when they are)."""
        out = []
        if self.optimizer != "sgd":
            out.append(
                f"optimizer {self.optimizer!r} is adaptive, not plain SGD with step "
                f"alpha={self.lr:g}"
            )
        if self.loss != "mse":
            out.append(f"loss {self.loss!r} is not the paper's squared TD error")
        if self.grad_clamp > 0:
            out.append(f"gradients are clamped to +-{self.grad_clamp:g}")
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, source: str = "config") -> TrainConfig:
        """Build from a plain mapping (a parsed TOML file); unknown keys are refused."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise InvalidArgument(
                f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        kwargs: JSONObject = {}  # the TOML table's values, checked by validate()
        for key, value in data.items():
            if key in ("hidden", "reward_range"):
                if not isinstance(value, list | tuple):
                    raise InvalidArgument(f"{source}: {key} must be a list, got {value!r}")
                value = tuple(value)
            if key == "env_kwargs":
                if not isinstance(value, Mapping):
                    raise InvalidArgument(f"{source}: env_kwargs must be a table, got {value!r}")
                value = dict(value)
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_toml(cls, path: str | Path) -> TrainConfig:
        """Read a TOML file (see configs/linewalk.toml) and validate it."""
        p = Path(path)
        try:
            with p.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise InvalidArgument(f"config file {str(p)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config file {str(p)!r} is not valid TOML: {exc}") from None
        cfg = cls.from_mapping(data, source=str(p))
        cfg.validate()
        return cfg

    def replace(self, **changes: Any) -> TrainConfig:  # dataclasses.replace's (Any there)
        """A copy with ``changes`` applied (None values are ignored), validated."""
        cfg = dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
        cfg.validate()
        return cfg

    def to_dict(self) -> JSONObject:
        """JSON/TOML-ready dict of every field (None fields omitted)."""
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        d["reward_range"] = list(self.reward_range)
        return {k: v for k, v in d.items() if v is not None}

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise InvalidArgument naming the first bad field (checks that need no env)."""
        self._validate_environment_and_network()
        self._validate_learning()
        self._validate_privacy()

    def _validate_environment_and_network(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise _bad(self, "env_id", "must be a non-empty Gymnasium id")
        if not isinstance(self.env_kwargs, dict):
            raise _bad(self, "env_kwargs", "must be a table")
        _integer(self, "samples", 1)
        _integer(self, "batch_size", 1)
        if self.batch_size > self.samples:
            raise InvalidArgument(
                f"config: batch_size B={self.batch_size} is larger than samples T="
                f"{self.samples}: not even one batch (Algorithm 1 runs T/B iterations)"
            )
        _number(self, "lr", lo=0.0, lo_open=True)
        _number(self, "gamma", lo=0.0, hi=1.0, hi_open=True)
        _number(self, "k", lo=0.0, lo_open=True)
        _number(self, "lipschitz", lo=0.0, lo_open=True)
        _integer(self, "resets", 1)
        if not self.hidden or any(
            isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.hidden
        ):
            raise _bad(self, "hidden", "must be a non-empty list of positive integers")
        if (
            len(self.reward_range) != 2
            or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in self.reward_range
            )
            or not self.reward_range[0] < self.reward_range[1]
        ):
            raise _bad(self, "reward_range", "must be [r_min, r_max] with finite r_min < r_max")
        for name in ("truncation_as_terminal", "replay", "calibrate_k"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(self, name, "must be true or false")

    def _validate_learning(self) -> None:
        _integer(self, "replay_capacity", 1)
        _integer(self, "learning_starts", 0)
        _integer(self, "updates_per_step", 1)
        _integer(self, "target_update_episodes", 0)
        if self.replay:
            if self.replay_capacity < self.batch_size:
                raise _bad(
                    self, "replay_capacity", f"must hold at least one batch (B={self.batch_size})"
                )
            if self.effective_learning_starts < self.batch_size:
                raise _bad(
                    self, "learning_starts", f"must be 0 or >= batch_size B={self.batch_size}"
                )
            if self.effective_learning_starts > self.samples:
                raise _bad(self, "learning_starts", f"exceeds samples T={self.samples}: no update")
        if self.optimizer not in OPTIMIZERS:
            raise _bad(self, "optimizer", f"must be one of {', '.join(OPTIMIZERS)}")
        if self.loss not in LOSSES:
            raise _bad(self, "loss", f"must be one of {', '.join(LOSSES)}")
        _number(self, "grad_clamp", lo=0.0)
        _number(self, "eps_start", lo=0.0, hi=1.0)
        _number(self, "eps_end", lo=0.0, hi=1.0)
        _number(self, "eps_decay", lo=0.0, lo_open=True)

    def _validate_privacy(self) -> None:
        if self.mode not in MODES:
            raise _bad(self, "mode", f"must be one of {', '.join(MODES)}")
        if self.sigma is not None:
            _number(self, "sigma", lo=0.0)
        if self.epsilon is not None:
            _number(self, "epsilon", lo=0.0, lo_open=True)
        if self.sigma is not None and self.epsilon is not None:
            raise InvalidArgument(
                f"config: give either sigma ({self.sigma!r}) or a target epsilon "
                f"({self.epsilon!r}), not both"
            )
        _number(self, "delta", lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        _number(self, "reward_sensitivity", lo=0.0, lo_open=True)
        n = self.iterations
        if self.resets > n:
            raise InvalidArgument(
                f"config: resets J={self.resets} exceeds the {n} iterations "
                f"({self._iteration_word()}): at most one new path per iteration"
            )
        if n % self.resets:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise InvalidArgument(
                f"config: resets J={self.resets} does not divide the {n} iterations "
                f"({self._iteration_word()}), so paths would not be reset every "
                f"iterations/J iterations (Algorithm 1 line 7); choose J in {divisors}"
            )

    def _iteration_word(self) -> str:
        if self.replay:
            return f"one per environment step, T={self.samples}"
        return f"T // B = {self.samples} // {self.batch_size}"


def load_config(path: str | Path) -> TrainConfig:
    """Shorthand for :meth:`TrainConfig.from_toml`."""
    return TrainConfig.from_toml(path)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf") if v == v else "nan"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg: TrainConfig) -> str:
    """The effective configuration as TOML (round-trips through :meth:`TrainConfig.from_toml`)."""
    lines = ["# qveil training configuration (effective values of this run)"]
    for key, value in cfg.to_dict().items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _bad(cfg: TrainConfig, name: str, msg: str) -> InvalidArgument:
    return InvalidArgument(f"config: {name}={getattr(cfg, name)!r}: {msg}")


def _integer(cfg: TrainConfig, name: str, lo: int) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _bad(cfg, name, f"must be an integer >= {lo}")


def _number(
    cfg: TrainConfig,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(cfg, name, "must be a finite number")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _bad(cfg, name, f"must be {'>' if lo_open else '>='} {lo:g}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise _bad(cfg, name, f"must be {'<' if hi_open else '<='} {hi:g}")
