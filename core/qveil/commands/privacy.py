"""``qveil privacy``: epsilon for a sigma, or the sigma for an epsilon, in any mode.

Defaults are the paper's Appendix E.3 settings (sources in ``--help``). Bad input prints a
clear message and exits 2 (argparse for malformed flags, qveil.errors.InvalidArgument for
out-of-range values, both through the ``qveil`` entry point).

    qveil privacy --mode gdp --sigma 0.74 --json
    qveil privacy --mode output --epsilon 0.9
    qveil privacy --mode fqi --users 300 --gamma 0.3 --epsilon 1 --delta 1e-5 --json

In fqi mode (the rigorous private FQI release, docs/privacy.md) the defaults of the
estimator and of the release map are those of configs/linewalk-private.toml (or --config
FILE), and the output adds D_T, kappa, Delta and the noise-to-value ratio
sigma / (r0 / (1 - gamma)), before any data is touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from qveil.cli_parser import Subcommands
from qveil.dataset import load_dataset
from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig, default_config, load_fqi_config, plan_kernel
from qveil.kfqi_prior import read_prior
from qveil.privacy.accountant import account, calibrate
from qveil.privacy.fqi import FQIPrivacyResult
from qveil.privacy.params import E3_SETTINGS, E3_SOURCES, MODES, PrivacyParams, PrivacyResult
from qveil.training_data import TrainingData

__all__ = ["add_parser", "params_from_args", "run"]


def add_parser(sub: Subcommands) -> None:
    e3, src = E3_SETTINGS, E3_SOURCES
    p = sub.add_parser(
        "privacy",
        help="privacy accountant: epsilon for a sigma, or sigma for an epsilon",
        description="Compute the privacy guarantee of a release (--sigma) or calibrate the "
        "smallest sigma for a target epsilon (--epsilon). Defaults are the "
        "paper's Appendix E.3 settings. See docs/privacy.md.",
    )
    p.add_argument(
        "--mode",
        choices=(*MODES, "fqi"),
        default="paper",
        help="paper: Theorem 5 as stated; gdp: exact mu-GDP composition of the "
        "paper's per-step sensitivity; output: strict, one GP mechanism at "
        "release; fqi: private fitted-Q iteration on an offline dataset (the rigorous "
        "default of `qveil train --dataset`) (default: %(default)s)",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--sigma", type=float, help="noise scale: report epsilon for it")
    g.add_argument(
        "--epsilon",
        type=float,
        help="target epsilon: calibrate the smallest sigma (and k in paper/gdp "
        "mode unless --k is given; beta in output mode)",
    )
    p.add_argument(
        "--delta",
        type=float,
        default=None,
        help=f"delta (default {e3['delta']:g}; {src['delta']}; fqi: the config's). With "
        f"--epsilon it is "
        f"the total target; paper/gdp split it half/half between the "
        f"mechanism and Lemma 8's noise bound, as in E.3",
    )
    _add_e3_flags(p, _E3_FLAGS[:3])
    p.add_argument(
        "--k",
        type=float,
        default=None,
        help=f"k, the noise bound of Lemma 8 (default {e3['k']:g}; {src['k']}); "
        f"with --epsilon and no --k, the smallest valid k is searched",
    )
    _add_e3_flags(p, _E3_FLAGS[3:6])
    p.add_argument(
        "--gamma",
        type=float,
        default=None,
        help=f"discount (default {e3['gamma']}; {src['gamma']}; fqi: the config's)",
    )
    _add_e3_flags(p, _E3_FLAGS[6:])
    p.add_argument(
        "--reward-sensitivity",
        type=float,
        default=e3["reward_sensitivity"],
        help=f"neighbours differ by ||r - r'||_inf <= this (default %(default)s; "
        f"{src['reward_sensitivity']})",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="SGD updates actually taken (default: ceil(T/B), rounded up)",
    )
    _add_fqi_flags(p.add_argument_group("fqi mode"))
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


#: Flags whose default is an Appendix E.3 setting: (settings key, type, what it is).
_E3_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("samples", int, "T, training samples"),
    ("batch_size", int, "B"),
    ("lr", float, "alpha, SGD learning rate"),
    ("lipschitz", float, "L in the unit state"),
    ("resets", int, "J, training noise paths"),
    ("actions", int, "m"),
    ("reward_bound", float, "r0, |r| <= r0"),
)


#: E.3 flags whose default depends on the mode: None on the command line, the E.3 setting
#: in the paper's modes (:func:`params_from_args`), the config's (or its env's) in fqi mode.
_FQI_OWN = {"actions": "fqi: the config's actions, else its env's action count"}


def _add_e3_flags(p: argparse.ArgumentParser, flags: tuple[tuple[str, type, str], ...]) -> None:
    """``--key`` flags defaulting to the E.3 setting, their help naming its source."""
    settings: Mapping[str, object] = E3_SETTINGS  # looked up by each flag's name
    for key, kind, what in flags:
        own = _FQI_OWN.get(key)
        p.add_argument(
            "--" + key.replace("_", "-"),
            type=kind,
            default=None if own else settings[key],
            help=f"{what} (default {settings[key]}; {E3_SOURCES[key]}"
            + (f"; {own})" if own else ")"),
        )


def _add_fqi_flags(f: argparse._ArgumentGroup) -> None:
    """The flags of fqi mode (its estimator, release map and forecast)."""
    f.add_argument("--users", type=int, help="N: users in the dataset (fqi)")
    f.add_argument(
        "--neighbour",
        choices=("user", "reward"),
        help="fqi: user (one user's whole data replaced; default) or reward",
    )
    f.add_argument("--config", metavar="FILE", help="fqi config (default: the 1-D defaults)")
    f.add_argument("--iterations", type=int, help="fqi: T, FQI iterations")
    f.add_argument(
        "--grid-points", type=int, dest="grid_points", help="fqi: G anchors per coordinate"
    )
    f.add_argument("--beta", type=float, help="fqi, d = 1: the noise kernel rate (default 2)")
    f.add_argument(
        "--forecast",
        action="store_true",
        help="fqi with --epsilon: also forecast the release's utility (the fraction of the way "
        "from random to non-private) by running the same estimator on public simulated data "
        "of N users (the config's env and behaviour_policy, random by default); spends no "
        "privacy",
    )
    f.add_argument(
        "--public-dataset",
        metavar="PATH",
        help="forecast on this public dataset instead of simulated users: it is fitted as it "
        "is, and its simulated releases carry the noise of N = --users users",
    )
    f.add_argument(
        "--forecast-releases", type=int, default=8, help="simulated releases (default 8)"
    )
    f.add_argument(
        "--forecast-episodes", type=int, default=20, help="episodes per policy (default 20)"
    )


def params_from_args(args: argparse.Namespace) -> PrivacyParams:
    """PrivacyParams from parsed flags (validated by PrivacyParams itself)."""
    return PrivacyParams(
        mode=args.mode,
        sigma=args.sigma,
        delta=E3_SETTINGS["delta"] if args.delta is None else args.delta,
        samples=args.samples,
        batch_size=args.batch_size,
        lr=args.lr,
        k=E3_SETTINGS["k"] if args.k is None else args.k,
        lipschitz=args.lipschitz,
        resets=args.resets,
        actions=E3_SETTINGS["actions"] if args.actions is None else args.actions,
        gamma=E3_SETTINGS["gamma"] if args.gamma is None else args.gamma,
        reward_bound=args.reward_bound,
        reward_sensitivity=args.reward_sensitivity,
        steps=args.steps,
    )


class ForecastReport(Protocol):
    """What ``--forecast`` prints of the trainer's :class:`qveil.trainer.forecast.Forecast`."""

    def to_dict(self) -> JSONObject: ...

    def text(self) -> str: ...


class ForecastFn(Protocol):
    """The trainer's :func:`qveil.trainer.forecast.forecast` (core does not import it)."""

    def __call__(
        self,
        config: KernelFQIConfig,
        *,
        users: int,
        epsilon: float,
        dataset: TrainingData | None,
        releases: int,
        episodes: int,
    ) -> ForecastReport: ...


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _text(r: PrivacyResult) -> str:
    d = r.to_dict()
    lines = [f"mode        {r.mode}", f"holds       {'yes' if r.holds else 'NO'}"]
    if r.holds:
        lines.append(f"guarantee   ({_fmt(r.epsilon)}, {_fmt(r.delta_total)})-DP")
    else:
        lines.append(f"reason      {r.reason}")
        lines.append(
            f"(formula alone would give epsilon {_fmt(r.epsilon_if_conditions_held)}"
            f" -- NOT a guarantee)"
        )
    for key in (
        "sigma",
        "beta",
        "k",
        "delta",
        "delta_noise_bound",
        "mu",
        "sensitivity",
        "mechanisms",
        "updates",
        "bound",
    ):
        if key in d and d[key] is not None:
            lines.append(f"{key:<11} {_fmt(d[key])}")
    if r.target is not None:
        t = r.target
        lines.append(
            f"target      eps {_fmt(t['epsilon'])}, delta {_fmt(t['delta'])}: "
            f"{'met' if t['met'] else 'NOT met'}"
        )
    lines.append(f"basis       {r.basis}")
    return "\n".join(lines)


def _fqi(
    args: argparse.Namespace, env_actions: Callable[[str], int]
) -> tuple[KernelFQIConfig, FQIPrivacyResult]:
    """The fqi plan from the config (or the 1-D defaults) and the flags: public quantities
    only. d comes from the config's state intervals or betas (the 1-D defaults: d = 1); m
    from ``--actions``, else the config's ``actions``, else its env's action count
    (``env_actions``), else the 1-D defaults' LineWalk (2)."""

    cfg = load_fqi_config(args.config) if args.config else default_config()
    if args.users is None:
        raise InvalidArgument("fqi mode needs --users N (the number of users in the dataset)")
    changes: dict[str, object] = {
        k: getattr(args, k)
        for k in ("gamma", "delta", "neighbour", "iterations")
        if getattr(args, k) is not None
    }
    if args.grid_points is not None:
        changes["anchor_points"] = args.grid_points
    if args.beta is not None:
        changes["betas"] = (args.beta,)
    if args.sigma is not None:
        changes.update(sigma=args.sigma, epsilon=None)
    else:
        changes.update(epsilon=args.epsilon, sigma=None)
    if args.actions is not None:
        changes["actions"] = args.actions
    kcfg = cfg.replace(**changes)
    dims = len(kcfg.state_intervals or kcfg.betas or ((0.0, 1.0),))
    rr = kcfg.reward_range or (0.0, float(args.reward_bound))
    return kcfg, plan_kernel(
        kcfg,
        users=args.users,
        actions=_actions(kcfg, args, env_actions),
        dims=dims,
        reward_range=rr,
        # the basis names the config's public prior, as the release's card will
        prior_sha256=None if kcfg.prior is None else read_prior(kcfg.prior).sha256,
    )


def _actions(
    cfg: KernelFQIConfig, args: argparse.Namespace, env_actions: Callable[[str], int]
) -> int:
    """m for the plan: the config's (``--actions`` set it), else its env's, else 2 for the
    1-D defaults (LineWalk's); a config file that says neither is refused."""
    if cfg.actions is not None:
        return int(cfg.actions)
    if cfg.env_id:
        try:
            return int(env_actions(cfg.env_id))
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"{exc}; set actions = M in the config (or pass --actions M)"
            ) from None
    if args.config:
        raise InvalidArgument(
            f"config {echo(args.config)} names neither actions nor an env_id: set "
            "actions = M in it (or pass --actions M)"
        )
    return int(E3_SETTINGS["actions"])


def _fqi_text(r: FQIPrivacyResult) -> str:
    lines = [
        "mode        fqi",
        "holds       yes",
        f"guarantee   ({_fmt(r.epsilon)}, {_fmt(r.delta_total)})-DP, neighbour: {r.neighbour}",
    ]
    betas = getattr(r.params, "betas", None)  # a release of d coordinates: one beta_j each
    for key, label, words in (
        ("sigma", "sigma", "standard deviation of the noise on every released value"),
        ("sup_sensitivity", "D_T", "the most one user's data moves a fitted value"),
        ("kappa", "kappa", "norm bound of the projection, 1 / (4 lambda)"),
        ("beta", "beta", "rate of the noise: nearby states get correlated noise"),
        ("sensitivity", "Delta", "sensitivity of the released function, D_T sqrt(m kappa)"),
        (
            "noise_to_value",
            "noise/value",
            f"sigma against the largest value: {100 * r.noise_to_value:.2g} %",
        ),
    ):
        if key == "beta" and betas:
            value = ", ".join(_fmt(float(b)) for b in betas)
            lines.append(f"{'betas':<11} {value:<11} ({words})")
            continue
        lines.append(f"{label:<11} {_fmt(getattr(r, key)):<11} ({words})")
    if r.noise_to_value > 1.0:
        lines.append("warning     noise/value > 1: expected WORSE THAN A RANDOM POLICY")
    elif r.noise_to_value > 0.5:
        lines.append("warning     noise/value > 0.5: the noise is a large part of the values")
    lines.append(f"basis       {r.basis}")
    return "\n".join(lines)


def _forecast(
    args: argparse.Namespace, cfg: KernelFQIConfig, forecast: ForecastFn
) -> ForecastReport:
    """The utility forecast (the trainer's estimators and simulators: ``forecast`` is
    :func:`qveil.trainer.forecast.forecast`, passed by the composition root :mod:`qveil.cli`,
    which loads the trainer only when it is called)."""
    if args.epsilon is None:
        raise InvalidArgument("--forecast needs --epsilon E (the release's epsilon)")
    public = None
    if args.public_dataset:
        public = load_dataset(args.public_dataset)
    try:
        return forecast(
            cfg,
            users=int(args.users),
            epsilon=float(args.epsilon),
            dataset=public,
            releases=args.forecast_releases,
            episodes=args.forecast_episodes,
        )
    except ImportError as exc:
        raise InvalidArgument(f"--forecast needs qveil[trainer] ({exc.name})") from None


def _round_up(x: float) -> float:
    """x rounded up to 3 significant digits (a k a person can type)."""
    e = math.floor(math.log10(x)) - 2
    return math.ceil(x / 10.0**e) * 10.0**e


def remedies(params: PrivacyParams) -> list[tuple[str, PrivacyResult]]:
    """When ``account(params)`` does not hold: the flags that would give an epsilon for the
    same sigma, each with the accountant's result. In paper/gdp mode the smallest ``--k``
    (rounded up to 3 digits) for which the guarantee holds with delta_total <= 2 x delta
    (Lemma 8's tail not swamping delta), found by a geometric grid and bisection and
    checked by the accountant; and ``--mode output`` (one mechanism at release, no k)."""
    out: list[tuple[str, PrivacyResult]] = []
    if params.mode in ("paper", "gdp"):

        def holds(k: float) -> PrivacyResult | None:
            try:
                r = account(dataclasses.replace(params, k=k))
            except ValueError:
                return None
            # a guarantee whose Lemma 8 tail swamps delta is no use: at most 2 x --delta
            ok = r.holds and r.delta_total is not None and r.delta_total <= 2 * params.delta
            return r if ok else None

        lo = max(float(params.k), 1e-3)
        hi = lo
        for _ in range(200):  # a geometric grid up to the first k that holds
            lo, hi = hi, hi * 1.5
            if holds(hi) is not None:
                for _ in range(40):  # then bisection down to the smallest one
                    mid = 0.5 * (lo + hi)
                    lo, hi = (lo, mid) if holds(mid) is not None else (mid, hi)
                k = _round_up(hi)
                r = holds(k)
                if r is not None:
                    out.append((f"--k {k:g}", r))
                break
    if params.mode != "output":
        try:
            r = account(dataclasses.replace(params, mode="output", k=params.k))
        except ValueError:
            r = None
        if r is not None and r.holds:
            out.append(("--mode output", r))
    return out


def _needs(params: PrivacyParams) -> str:
    fixes = remedies(params)
    if not fixes:
        return (
            "no epsilon: the guarantee does not hold for these flags, and neither a larger "
            "--k nor --mode output fixes it (see the reason above)"
        )
    lines = ["no epsilon for these flags; for this sigma, add one of:"]
    for flag, r in fixes:
        lines.append(
            f"  {flag:<16} -> ({_fmt(r.epsilon)}, {_fmt(r.delta_total)})-DP   [{r.mode} mode]"
        )
    return "\n".join(lines)


def run(
    args: argparse.Namespace,
    *,
    forecast: ForecastFn,
    env_actions: Callable[[str], int],
) -> int:
    """Account, calibrate or plan (``--mode fqi``); ``forecast``: the trainer's utility
    forecast, for ``--forecast``; ``env_actions``: an env's action count, for an fqi config
    that names its env but not its actions (both passed by :mod:`qveil.cli`)."""
    if args.mode == "fqi":
        cfg, result = _fqi(args, env_actions)
        fc = _forecast(args, cfg, forecast) if args.forecast else None
        if args.json:
            d = result.to_dict()
            if fc is not None:
                d["forecast"] = fc.to_dict()
            print(json.dumps(d, indent=2, allow_nan=False))
        else:
            print(_fqi_text(result))
            if fc is not None:
                print(fc.text())
        return 0
    if args.forecast:
        raise InvalidArgument("--forecast is for --mode fqi (a config, --users N, --epsilon E)")
    params = params_from_args(args)
    if args.epsilon is not None:
        res = calibrate(params, target_epsilon=args.epsilon, tune=args.k is None)
    else:
        res = account(params)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2, allow_nan=False))
    else:
        print(_text(res))
        if not res.holds and args.epsilon is None:
            print(_needs(params))
    return 0
