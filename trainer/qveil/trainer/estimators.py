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
* :meth:`Estimator.summary` -- what the CLI prints about the written release (written with
  it, into its :class:`Outcome`).

The edge is typed: ``Estimator[ConfigT, PlanT]`` takes a config of type ``ConfigT`` (an
:class:`EstimatorConfig`: a privacy target of sigma, or epsilon at delta), plans a
``PlanT`` (a :class:`ReleasePlan`: the accountant's result, sigma, epsilon, mu, ...), and
trains on :class:`qveil.training_data.TrainingData` (a :class:`qveil.dataset.Dataset` or a
streamed :class:`qveil.dataset_parquet.ParquetSource`) on an optional
:class:`qveil.trainer.distributed.Engine`.

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
from typing import ClassVar, Generic, Protocol, TypeVar, overload

from qveil.bundle import value_scale_warning
from qveil.errors import InvalidArgument
from qveil.fqi_config import read_toml
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig, default_config, load_fqi_config, plan_kernel
from qveil.privacy.events import Accounting
from qveil.privacy.fqi import FQIPrivacyResult
from qveil.privacy.params import PrivacyResult
from qveil.trainer.config import TrainConfig
from qveil.trainer.distributed import Engine
from qveil.trainer.kfqi import summary, train_kernel_fqi
from qveil.trainer.train import main_summary, make_env, privacy_for, run_training
from qveil.training_data import TrainingData

__all__ = [
    "ALIASES",
    "ESTIMATORS",
    "AnyEstimator",
    "Estimator",
    "EstimatorConfig",
    "KernelFQIConfig",
    "Outcome",
    "ReleasePlan",
    "TrainConfig",
    "create_estimator",
    "estimator_name",
    "load_config",
    "register",
]


class EstimatorConfig(Protocol):
    """What every estimator's config has (:class:`qveil.kfqi_config.KernelFQIConfig`,
    :class:`qveil.trainer.config.TrainConfig`): its privacy target, a noise scale ``sigma``
    or an ``epsilon``, at ``delta``."""

    @property
    def sigma(self) -> float | None: ...
    @property
    def epsilon(self) -> float | None: ...
    @property
    def delta(self) -> float: ...


class ReleasePlan(Accounting, Protocol):
    """The accountant's plan of a release from public quantities
    (:class:`qveil.privacy.fqi.FQIPrivacyResult`, :class:`qveil.privacy.PrivacyResult`):
    the noise scale ``sigma``, the guarantee (epsilon, delta_total, mu) when it ``holds``,
    and the sensitivity it is calibrated to. Its ``params`` are what the ledger records
    (:meth:`qveil.privacy.ledger.PrivacyEvent.from_result`)."""

    @property
    def sensitivity(self) -> float | None: ...


ConfigT = TypeVar("ConfigT", bound=EstimatorConfig, covariant=True)
PlanT = TypeVar("PlanT", bound=ReleasePlan, covariant=True)


@dataclass(frozen=True)
class Outcome:
    """A written release: its bundle directory and card, warnings for the operator, and the
    few lines the CLI prints about it."""

    path: Path
    card: JSONObject  # the card (qveil.bundle.card)
    warnings: tuple[str, ...]
    summary: str


class Estimator(ABC, Generic[ConfigT, PlanT]):
    """A private estimator of a config of type ``ConfigT`` whose plan is a ``PlanT`` (see
    the module docstring)."""

    name: ClassVar[str]
    #: True when :meth:`train` needs an offline dataset; False for online training
    needs_dataset: ClassVar[bool] = True

    def __init__(self, config: ConfigT) -> None:
        self._config = config

    @property
    def config(self) -> ConfigT:
        """The estimator's config."""
        return self._config

    @abstractmethod
    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> PlanT:
        """The accountant's result for this config from public quantities only."""

    def public_plan(self) -> PlanT:
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
        dataset: TrainingData | None,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Engine | None = None,
        allow_clipping: bool = False,
    ) -> Outcome:
        """Fit on ``dataset`` (None for online estimators), account and write the bundle.
        ``engine`` is where a fit that runs as map-reduce tasks runs (None: in this
        process). ``allow_clipping``: train even when most rows lie outside the config's
        state intervals (an estimator on a dataset refuses that otherwise;
        :func:`qveil.trainer.kfqi.check_clipping`)."""

    def summary(self, outcome: Outcome) -> str:
        """A few lines about the written release."""
        return outcome.summary


#: An estimator of any registered kind: its config and plan have the common types.
AnyEstimator = Estimator[EstimatorConfig, ReleasePlan]
#: estimator name -> class; filled by :func:`register`.
ESTIMATORS: dict[str, type[AnyEstimator]] = {}

E = TypeVar("E", bound=AnyEstimator)


def register(name: str) -> Callable[[type[E]], type[E]]:
    """Class decorator: register an estimator under ``name`` (the config's ``estimator``)."""

    def deco(cls: type[E]) -> type[E]:
        if name in ESTIMATORS:
            raise InvalidArgument(f"estimator {name!r} is registered already")
        cls.name = name
        ESTIMATORS[name] = cls
        return cls

    return deco


def estimator_name(config: EstimatorConfig) -> str:
    """The registered name of a config's estimator."""
    if isinstance(config, KernelFQIConfig):
        return "kernel"
    if isinstance(config, TrainConfig):
        return "algorithm1"
    raise InvalidArgument(f"no estimator takes a {type(config).__name__} config")


@overload
def create_estimator(config: KernelFQIConfig) -> KernelFQI: ...
@overload
def create_estimator(config: TrainConfig) -> Algorithm1: ...
@overload
def create_estimator(config: EstimatorConfig) -> AnyEstimator: ...
def create_estimator(config: EstimatorConfig) -> AnyEstimator:
    """The estimator of ``config`` (any of the registered kinds)."""
    return ESTIMATORS[estimator_name(config)](config)


#: Config names that are another registered estimator: a 1-D ``grid`` config is the kernel
#: estimator with d = 1 (:func:`qveil.kfqi_config.grid_config`).
ALIASES = {"grid": "kernel"}


def load_config(
    path: str | Path | None, *, estimator: str = "grid"
) -> KernelFQIConfig | TrainConfig:
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
class KernelFQI(Estimator[KernelFQIConfig, FQIPrivacyResult]):
    """fqi on states of d >= 1 coordinates: the per-user averager over public anchors,
    subspace KRR onto the additive RKHS of the noise (:mod:`qveil.kfqi`); with d = 1 the
    additive kernel is the OU kernel exp(-beta |x - y|)."""

    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> FQIPrivacyResult:
        plan: FQIPrivacyResult = plan_kernel(
            self.config, users=users, actions=actions, dims=dims, reward_range=reward_range
        )
        return plan

    def train(
        self,
        dataset: TrainingData | None,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Engine | None = None,
        allow_clipping: bool = False,
    ) -> Outcome:
        if dataset is None:
            raise InvalidArgument("the kernel estimator fits a dataset: give --dataset PATH")
        o = train_kernel_fqi(
            self.config, dataset, out, force=force, engine=engine, allow_clipping=allow_clipping
        )
        warnings = _warned(o.warning) + _warned(o.clipping)
        return Outcome(path=o.path, card=o.card, warnings=warnings, summary=summary(o))


@register("algorithm1")
class Algorithm1(Estimator[TrainConfig, PrivacyResult]):
    """Wang & Hegde (2019), Algorithm 1: DQN with functional noise, trained online in the
    config's environment (its simulated users are the data); ``paper``, ``gdp`` or ``output``
    accounting (:mod:`qveil.trainer.train`)."""

    needs_dataset = False

    def plan(
        self, *, users: int, actions: int, dims: int, reward_range: tuple[float, float]
    ) -> PrivacyResult:
        return self._plan(n_actions=actions)

    def public_plan(self) -> PrivacyResult:
        info = make_env(self.config)
        try:
            return self._plan(n_actions=info.n_actions)
        finally:
            info.env.close()

    def _plan(self, *, n_actions: int) -> PrivacyResult:
        result, _ = privacy_for(self.config, n_actions=n_actions)
        if not isinstance(result, PrivacyResult):  # the sigma = 0 baseline's card entry
            raise InvalidArgument(
                "sigma = 0 is the non-private baseline: it has no privacy guarantee to plan"
            )
        return result

    def train(
        self,
        dataset: TrainingData | None,
        out: str | Path,
        *,
        force: bool = False,
        seed: int | None = None,
        progress: bool = False,
        engine: Engine | None = None,
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
        return Outcome(path=o.path, card=o.card, warnings=tuple(warnings), summary=main_summary(o))


def _warned(warning: str | None) -> tuple[str, ...]:
    return () if not warning else (warning,)
