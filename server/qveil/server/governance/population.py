"""Populations: the people whose data releases use, each declared once with one budget.

A population is a name in the registry's ledger (:mod:`qveil.server.governance.registry`) with a
budget (epsilon_B, delta_B), kept as the ledger's cap history (append-only, hash-chained). Every
release trained on the population's data (``qveil train --population NAME``, retrains, private
evaluations) is one event in that ledger, whatever directory its bundle goes to, and a release the
population's privacy filter does not let through is refused before any data is read
(``qveil.privacy.filter_check``: the Gaussian filter for Gaussian mechanisms, valid when each
release is chosen after seeing the earlier ones). Datasets that share people (a superset, a
resample, a second export) name the same population and so share its budget.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from qveil.errors import BudgetExceeded, FailedPrecondition, InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.privacy.gaussian import gdp_epsilon
from qveil.privacy.ledger import PrivacyEvent, filter_check, filter_state
from qveil.release_records import validate_population
from qveil.server.governance.registry import Registry

if TYPE_CHECKING:  # matplotlib loads only when a plot is drawn
    from matplotlib.figure import Figure

__all__ = ["create", "precheck", "report", "plot_spending", "spending_figure"]


def create(registry: Registry, name: str, *, epsilon: float, delta: float) -> JSONObject:
    """Declare a population with its budget, once (a second declaration is refused: a budget
    that could be raised later would not bound anything)."""
    validate_population(name)
    for what, v in (("epsilon", epsilon), ("delta", delta)):
        if not (isinstance(v, int | float) and math.isfinite(v)):
            raise InvalidArgument(f"--{what} must be a finite number, got {v!r}")
    if not epsilon > 0 or not 0 < delta < 1:
        raise InvalidArgument(
            f"a budget needs epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}"
        )
    if registry.ledger.cap(name) is not None:
        raise FailedPrecondition(
            f"population {echo(name)} is declared already (a population has one budget): "
            f"qveil budget show {name}"
        )
    registry.ledger.set_cap(name, cap_epsilon=epsilon, cap_delta=delta, actor=registry.actor)
    return report(registry, name)


def report(registry: Registry, name: str) -> JSONObject:
    """Budget, spending under the filter, what one more release may still have, and every
    event with its time (NotFound-like FailedPrecondition for an undeclared population)."""
    validate_population(name)
    cap = registry.ledger.cap(name)
    if cap is None:
        raise FailedPrecondition(
            f"population {echo(name)} is not declared: qveil budget create {name} "
            "--epsilon EPS --delta DELTA"
        )
    entries = registry.ledger.entries(name)
    state = filter_state(
        [e.event for e in entries], budget_epsilon=cap.epsilon, budget_delta=cap.delta
    )
    return {
        "population": name,
        "registry": registry.url,
        "declared_at": cap.created_at,
        "declared_by": cap.actor,
        **state.to_dict(),
        "events": [
            {
                "release_id": e.release_id,
                "at": e.created_at,
                "mode": e.event.mode,
                "epsilon": e.event.epsilon,
                "delta": e.event.delta,
                "mu": e.event.mu,
            }
            for e in entries
        ],
    }


def precheck(registry: Registry, name: str, event: PrivacyEvent) -> JSONObject:
    """Refuse (BudgetExceeded / FailedPrecondition, nothing written) a planned release the
    population's filter would not let through; run before any private data is read. Returns
    the filter's state with the release added."""
    validate_population(name)
    cap = registry.ledger.cap(name)
    if cap is None:
        raise FailedPrecondition(
            f"population {echo(name)} has no budget: declare it once with qveil budget create "
            f"{name} --epsilon EPS --delta DELTA"
        )
    events = [e.event for e in registry.ledger.entries(name)]
    try:
        return filter_check(
            events, event, budget_epsilon=cap.epsilon, budget_delta=cap.delta
        ).to_dict()
    except BudgetExceeded:
        raise


def plot_spending(rep: JSONObject, png: str | Path) -> None:
    """Write :func:`spending_figure` as the PNG ``png``."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib.pyplot as plt

    fig = spending_figure(rep)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def spending_figure(rep: JSONObject) -> Figure:
    """Spending over time: the filter's spent epsilon (at the budget's delta) after each
    release, against the budget line. The time axis spans the releases with a margin (a day
    either side of a single release), in UTC; the legend stands below the axes, off the
    data."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot and dates after matplotlib.use('Agg') above: no display is needed
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    budget_eps, budget_delta = rep["budget"]["epsilon"], rep["budget"]["delta"]
    times, spent = [], []
    mu2 = 0.0
    eps_sum = 0.0
    for e in rep["events"]:
        times.append(datetime.fromisoformat(e["at"]))
        if rep["mu_budget"] is not None and e["mu"] is not None:
            mu2 += float(e["mu"]) ** 2
            spent.append(gdp_epsilon(delta=budget_delta, mu=math.sqrt(mu2)))
        else:
            eps_sum += float(e["epsilon"])
            spent.append(eps_sum)
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    if times:
        # matplotlib plots datetimes through its date converter; its stubs accept numbers only
        ax.step(times, spent, where="post", marker="o", label="spent (filter)")  # type: ignore[arg-type]
        span = max(times) - min(times)
        pad = span * 0.08 if span > timedelta(0) else timedelta(days=1)
        ax.set_xlim(min(times) - pad, max(times) + pad)  # type: ignore[arg-type]
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.axhline(budget_eps, color="tab:red", linestyle="--", label=f"budget eps={budget_eps:g}")
    ax.set_title(f"population {rep['population']}: privacy spent (delta={budget_delta:g})")
    ax.set_xlabel("time of the release (UTC)")
    ax.set_ylabel("epsilon")
    ax.set_ylim(0, budget_eps * 1.15)
    fig.legend(loc="outside lower center", ncols=2, frameon=False)
    return fig
