"""Privacy ledger on by default: every release ``qveil train`` writes or
``qveil serve`` serves is recorded against its training data.

The ledger key is the training data's identity: the card's ``dataset_fingerprint`` (a release
trained from a fixed data set, e.g. mode ``fqi``), else its ``env_id`` (online training: the
environment's users are the data). The event is the accountant's, recomputed from the card's
own ``privacy_params`` (``qveil.privacy.events.account_params``; non-negotiable 6), never the
card's printed numbers. A release is recorded once per ledger (by release id): a retrain
already recorded under an admin-chosen dataset id is not charged again when it is served.

``budget`` (``--budget EPS`` on serve and admin) refuses a release whose entry would push its
dataset's composed epsilon past EPS (composition: ``qveil.privacy.compose_with_rule``); a
cap set with ``qveil admin set-cap`` is checked too, when there is one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from qveil.errors import BudgetExceeded, FailedPrecondition, InvalidArgument, echo
from qveil.json_types import JSONMapping
from qveil.privacy.events import account_params
from qveil.privacy.ledger import PrivacyEvent
from qveil.server.governance.ledger import Ledger

__all__ = ["LedgerOutcome", "dataset_key", "event_for_card", "record_release"]

log = logging.getLogger("qveil.server")


def dataset_key(card: JSONMapping) -> str:
    """The ledger key of a release: its dataset fingerprint, else its environment id."""
    fp = card.get("dataset_fingerprint")
    if isinstance(fp, str) and fp:
        return fp
    return str(card["env_id"])


def event_for_card(card: JSONMapping, *, dataset_id: str) -> PrivacyEvent | None:
    """The release's privacy event, recomputed by the accountant from the card's parameters
    (None when it has no guarantee: sigma = 0 or conditions that fail)."""
    pp = card.get("privacy_params")
    if not isinstance(pp, Mapping) or pp.get("sigma") == 0:
        return None
    result = account_params(pp)
    if not result.holds or result.epsilon is None:
        return None
    return PrivacyEvent.from_result(result, dataset_id=dataset_id, bundle_id=str(card["bundle_id"]))


@dataclass(frozen=True)
class LedgerOutcome:
    """What recording a release did: ``recorded`` (a new entry), ``already`` (an entry
    existed), or ``none`` (no guarantee: nothing to charge)."""

    status: str
    dataset_id: str
    spent_epsilon: float
    spent_delta: float
    rule: str

    def describe(self) -> str:
        if self.status == "none":
            return f"not in the ledger of {self.dataset_id}: the release has no guarantee"
        return (
            f"ledger of {echo(self.dataset_id)}: "
            f"{'recorded' if self.status == 'recorded' else 'already recorded'}; "
            f"dataset spent eps={self.spent_epsilon:.6g} delta={self.spent_delta:.3g} "
            f"({self.rule})"
        )


def record_release(
    ledger: Ledger,
    card: JSONMapping,
    *,
    actor: str,
    budget: float | None = None,
    population: str | None = None,
) -> LedgerOutcome:
    """Record the release of ``card`` in ``ledger`` (a
    :class:`qveil.server.governance.ledger.Ledger`)
    unless it is there already; refuse (BudgetExceeded, nothing written) past ``budget`` or
    the dataset's cap. An already recorded release is refused when its dataset is past
    ``budget`` now."""
    if budget is not None and not (isinstance(budget, int | float) and budget >= 0):
        raise InvalidArgument(f"--budget must be an epsilon >= 0, got {budget!r}")
    rid = str(card["bundle_id"])
    dataset_id = population or dataset_key(card)
    entry = ledger.entry_for_release(rid)
    if entry is not None:
        rep = ledger.budget(entry.dataset_id)
        if budget is not None and rep.spent[0] > budget:
            raise BudgetExceeded(
                dataset_id=entry.dataset_id,
                spent=rep.spent,
                requested=(entry.event.epsilon, entry.event.delta),
                cap=(float(budget), 1.0),
            )
        return LedgerOutcome("already", entry.dataset_id, rep.spent[0], rep.spent[1], rep.rule)
    event = event_for_card(card, dataset_id=dataset_id)
    if event is None:
        if population is not None:
            raise FailedPrecondition(
                f"release {echo(rid)} has no privacy guarantee (no epsilon): it cannot be "
                f"charged to population {echo(population)}"
            )
        if budget is not None:
            raise FailedPrecondition(
                f"release {echo(rid)} has no privacy guarantee (no epsilon), so it cannot be "
                f"served under --budget {budget:g}"
            )
        log.warning("release %s has no privacy guarantee: not recorded in the ledger", rid)
        return LedgerOutcome("none", dataset_id, 0.0, 0.0, "")
    try:
        ledger.record(
            event,
            release_id=rid,
            actor=actor,
            require_cap=population is not None,
            budget=budget,
        )
    except FailedPrecondition:
        if ledger.entry_for_release(rid) is None:
            raise
        # another replica recorded it between our look-up and our write: charged once
        return record_release(ledger, card, actor=actor, budget=budget, population=population)
    rep = ledger.budget(dataset_id)
    return LedgerOutcome("recorded", dataset_id, rep.spent[0], rep.spent[1], rep.rule)
