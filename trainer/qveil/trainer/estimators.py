"""One interface for every private estimator, and a registry of them.

An estimator turns a public configuration and the private data of a population into one
release bundle. Every kind has the same edge (in the shape of Opacus's accountant registry):

* :meth:`Estimator.plan` -- the release's privacy accounting from public quantities only
  (users, actions, coordinates, the reward range): sigma, the sensitivity and the
  noise-to-value ratio, before any private row is read;
* :meth:`Estimator.public_plan` -- the same from the config alone, for an online estimator
  whose environment fixes those quantities (``qveil admin retrain`` plans with it);
* :meth:`Estimator.train` -- fit, account and write the bundle (model, card, log)
  atomically; nothing is written on any error;
* :meth:`Estimator.summary` -- what the CLI prints about the written release.

The kinds register under the config's ``estimator`` key: ``kernel`` (fqi with states of
d >= 1 coordinates, :mod:`qveil.kfqi`; a 1-D ``grid`` config is this estimator with d = 1,
:func:`qveil.kfqi_config.grid_config`), and ``algorithm1`` (Wang & Hegde's Algorithm 1,
online, in its ``paper``, ``gdp`` and ``output`` accounting modes). :func:`load_config` is
the one config loader (a TOML file's ``estimator`` key, or its ``mode`` for Algorithm 1);
:func:`create_estimator` builds the estimator of a config; callers never branch on the kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from qveil.bundle import value_scale_warning
from qveil.errors import InvalidArgument
from qveil.fqi_config import read_toml
from qveil.kfqi_config import KernelFQIConfig, default_config, load_fqi_config, plan_kernel
from qveil.trainer.config import TrainConfig
from qveil.trainer.kfqi import summary, train_kernel_fqi
from qveil.trainer.train import main_summary, make_env, privacy_for, run_training

__all__ = [
    "ALIASES",
    "ESTIMATORS",
    "Estimator",
    "Outcome",
    "create_estimator",
    "estimator_name",
    "load_config",
    "register",
]

#: estimator name -> class; filled by :func:`register`.
ESTIMATORS: dict[str, type[Estimator]] = {}


@dataclass(frozen=True)
class Outcome:
    """A written release: its bundle directory and card, and warnings for the operator."""

    path: Path
    card: dict[str, Any]
    warnings: tuple[str, ...]
    detail: Any = None


class Estimator(ABC):
    """A private estimator of one config (see the module docstring)."""

    name: ClassVar[str]
    #: True when :meth:`train` needs an offline dataset; False for online training
    needs_dataset: ClassVar[bool] = True

    def __init__(self, config: Any) -> None:
        self.config = config

    @abstractmethod
    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> Any:
        """The accountant's result for this config from public quantities only."""

    def public_plan(self) -> Any:
        """The accountant's result when the config alone fixes every public quantity (an
        online estimator: its environment's users and actions); an estimator that needs a
        dataset's counts refuses (use :meth:`plan`)."""
        raise InvalidArgument(
            f"the {self.name} estimator is planned from its dataset's public counts "
            "(users, actions, coordinates), not from its config alone"
        )

    @abstractmethod
    def train(
        self,
        dataset: Any,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Any = None,
        allow_clipping: bool = False,
    ) -> Outcome:
        """Fit on ``dataset`` (None for online estimators), account and write the bundle.
        ``engine`` (:class:`qveil.trainer.distributed.Engine`) is where a fit that runs as
        map-reduce tasks runs (None: in this process). ``allow_clipping``: train even when
        most rows lie outside the config's state intervals (an estimator on a dataset
        refuses that otherwise; :func:`qveil.trainer.kfqi.check_clipping`)."""

    @abstractmethod
    def summary(self, outcome: Outcome) -> str:
        """A few lines about the written release."""


def register(name: str) -> Callable[[type[Estimator]], type[Estimator]]:
    """Class decorator: register an estimator under ``name`` (the config's ``estimator``)."""

    def deco(cls: type[Estimator]) -> type[Estimator]:
        if name in ESTIMATORS:
            raise InvalidArgument(f"estimator {name!r} is registered already")
        cls.name = name
        ESTIMATORS[name] = cls
        return cls

    return deco


def estimator_name(config: Any) -> str:
    """The registered name of a config's estimator."""
    if isinstance(config, KernelFQIConfig):
        return "kernel"
    if isinstance(config, TrainConfig):
        return "algorithm1"
    raise InvalidArgument(f"no estimator takes a {type(config).__name__} config")


def create_estimator(config: Any) -> Estimator:
    """The estimator of ``config`` (any of the registered kinds)."""
    return ESTIMATORS[estimator_name(config)](config)


#: Config names that are another registered estimator: a 1-D ``grid`` config is the kernel
#: estimator with d = 1 (:func:`qveil.kfqi_config.grid_config`).
ALIASES = {"grid": "kernel"}


def load_config(path: str | Path | None, *, estimator: str = "grid") -> Any:
    """The one config loader: the TOML file's ``estimator`` (``kernel``, ``grid`` (the kernel
    estimator with d = 1) or ``algorithm1``; a file whose ``mode`` is paper, gdp or output is
    ``algorithm1``), or, with no file, the 1-D defaults of ``estimator`` ``grid``."""
    if path is None:
        if estimator == "grid":
            return default_config()
        raise InvalidArgument(f"the {estimator} estimator needs --config FILE")
    d = read_toml(path)
    name = d.get("estimator")
    if name is None:
        name = "algorithm1" if d.get("mode", "fqi") != "fqi" else estimator
    if ALIASES.get(name, name) not in ESTIMATORS:
        names = sorted({*ESTIMATORS, *ALIASES})
        raise InvalidArgument(f"estimator must be one of {', '.join(names)}, got {str(name)!r:.80}")
    if name == "algorithm1":
        return TrainConfig.from_toml(path)
    return load_fqi_config(path)


# ----------------------------------------------------------------------------- the kinds
@register("kernel")
class KernelFQI(Estimator):
    """fqi on states of d >= 1 coordinates: the per-user averager over public anchors,
    subspace KRR onto the additive RKHS of the noise (:mod:`qveil.kfqi`); with d = 1 the
    additive kernel is the OU kernel exp(-beta |x - y|)."""

    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> Any:
        return plan_kernel(
            self.config, users=users, actions=actions, dims=dims, reward_range=reward_range
        )

    def train(
        self,
        dataset: Any,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Any = None,
        allow_clipping: bool = False,
    ) -> Outcome:
        o = train_kernel_fqi(
            self.config, dataset, out, force=force, engine=engine, allow_clipping=allow_clipping
        )
        warnings = _warned(o.warning) + _warned(o.clipping)
        return Outcome(path=o.path, card=o.card, warnings=warnings, detail=o)

    def summary(self, outcome: Outcome) -> str:
        return summary(outcome.detail)


@register("algorithm1")
class Algorithm1(Estimator):
    """Wang & Hegde (2019), Algorithm 1: DQN with functional noise, trained online in the
    config's environment (its simulated users are the data); ``paper``, ``gdp`` or ``output``
    accounting (:mod:`qveil.trainer.train`)."""

    needs_dataset = False

    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> Any:
        result, _ = privacy_for(self.config, n_actions=actions)
        return result

    def public_plan(self) -> Any:
        info = make_env(self.config)
        try:
            result, _ = privacy_for(self.config, n_actions=info.n_actions)
        finally:
            info.env.close()
        return result

    def train(
        self,
        dataset: Any,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Any = None,
        allow_clipping: bool = False,
    ) -> Outcome:
        if dataset is not None:
            raise InvalidArgument("Algorithm 1 trains online in its environment: no --dataset")
        if engine is not None and not engine.local:
            raise InvalidArgument("Algorithm 1 trains in one process: no --workers or --cluster")
        o = run_training(self.config, out, seed=seed, progress=progress)
        warnings = [w for w in (value_scale_warning(o.card),) if w]
        if not o.card["holds"]:
            warnings.append(f"the guarantee does not hold: {o.card['reason']}")
        return Outcome(path=o.path, card=o.card, warnings=tuple(warnings), detail=o)

    def summary(self, outcome: Outcome) -> str:
        return main_summary(outcome.detail)


def _warned(warning: str | None) -> tuple[str, ...]:
    return () if not warning else (warning,)
