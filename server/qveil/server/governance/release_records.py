"""The registry as the trainer's release records (:class:`qveil.release_records.ReleaseRecords`):
the population ledger, the audit log and the signed receipt of a written bundle's charge.

The trainer never imports the server; the composition root (:mod:`qveil.cli`) passes
:func:`open_release_records` to ``qveil train`` and ``qveil evaluate`` when they run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qveil.bundle import load_bundle
from qveil.bundle.receipt import write_receipt
from qveil.errors import FailedPrecondition, echo
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.ledger import PrivacyEvent, spending_line
from qveil.release_records import validate_population
from qveil.server.governance import audit_log
from qveil.server.governance import population as pop
from qveil.server.governance.registry import Registry, open_registry
from qveil.server.governance.release_ledger import record_release

__all__ = ["SIMULATED_POPULATION", "RegistryRecords", "charge_simulated", "open_release_records"]

#: The population of simulated users (experiments on public simulators: no person's data)
SIMULATED_POPULATION = "simulated-users"


class RegistryRecords:
    """:class:`qveil.release_records.ReleaseRecords` over one open :class:`Registry`."""

    def __init__(self, registry: Registry, *, url: str | None) -> None:
        self.registry = registry
        self._url = url

    @property
    def url(self) -> str:
        return str(self.registry.url)

    def population_report(self, population: str) -> JSONObject:
        return pop.report(self.registry, validate_population(population))

    def precheck(self, population: str, event: PrivacyEvent) -> JSONObject:
        return pop.precheck(self.registry, validate_population(population), event)

    def record_release(self, bundle: Path, *, population: str | None) -> str:
        card = load_bundle(bundle, verify=True).card  # public + admin card (dataset_fingerprint)
        actor = self.registry.actor
        out = record_release(self.registry.ledger, card, actor=actor, population=population)
        where = self.url
        if population is None:
            return f"privacy {out.describe()} [{where}]"
        rep = pop.report(self.registry, population)
        return (
            f"privacy: {spending_line(population, rep)}, {len(rep['events'])} release(s) [{where}]"
        )

    def issue_receipt(self, bundle: Path) -> str:
        """Sign the receipt of the written bundle's recorded charge and write it into the
        bundle (``receipt.json``): what ``qveil serve`` verifies before it answers anything.
        FailedPrecondition when the ledger has no charge of the release."""
        b = load_bundle(bundle, verify=True)
        rid = b.bundle_id
        entry = self.registry.ledger.entry_for_release(rid)
        if entry is None:
            if b.card.get("holds") and b.card.get("epsilon") is not None:
                raise FailedPrecondition(
                    f"release {echo(rid)} has no charge in the ledger of {echo(self.url)}: "
                    "no receipt is signed for it"
                )
            # no guarantee (sigma 0, or conditions that fail): nothing to charge, and the
            # receipt says so (epsilon inf)
            population, eps, delta = str(b.card.get("env_id")), float("inf"), 1.0
        else:
            population, eps, delta = entry.dataset_id, entry.event.epsilon, entry.event.delta
            if self.registry.ledger.cap(population) is None:
                raise FailedPrecondition(
                    f"release {echo(rid)} is charged to {echo(population)}, which is not a "
                    f"declared population (no budget): no receipt is signed for it; declare it "
                    f"(qveil budget create NAME --epsilon E --delta D) and train with "
                    f"--population NAME"
                )
        receipt = self.registry.sign_receipt(
            release_id=rid,
            population=population,
            epsilon=eps,
            delta=delta,
            key_sha256=str(b.card["key_sha256"]),
            weights_sha256=str(b.card["weights_sha256"]),
            card_sha256=str(b.card["card_sha256"]),
        )
        write_receipt(bundle, receipt)
        return (
            f"receipt: release {rid} charged to {population} (eps={eps:.6g}, "
            f"delta={delta:.3g}), signed by registry {self.registry.registry_id} "
            f"[{self.url}]"
        )

    def record_evaluation(
        self, population: str, event: PrivacyEvent, *, target: str, params: JSONMapping
    ) -> None:
        reg = self.registry
        reg.ledger.record(event, release_id=None, actor=reg.actor, require_cap=True)
        audit_log.append(
            reg.db,
            actor=reg.actor,
            action="private-evaluation",
            target=target,
            outcome="ok",
            params=dict(params) | {"population": population},
        )


@contextmanager
def open_release_records(url: str | None, *, actor: str) -> Iterator[RegistryRecords]:
    """The records of the registry at ``url`` (default: ``QVEIL_REGISTRY``, else
    ``$QVEIL_HOME/registry.sqlite``), opened for ``actor``."""
    with open_registry(url, actor=actor) as reg:
        yield RegistryRecords(reg, url=url)


def charge_simulated(bundle: Path, *, url: str | None = None) -> str:
    """Charge a release fitted on SIMULATED users (an experiment on a public simulator) to the
    registry's ``simulated-users`` population (declared on first use with a budget that binds
    nothing: no person is behind it) and write the receipt, so that the real server serves
    it. Never for a release of people's data: that is ``qveil train --population``."""
    with open_release_records(url, actor="qveil experiments") as rec:
        if rec.registry.ledger.cap(SIMULATED_POPULATION) is None:
            pop.create(rec.registry, SIMULATED_POPULATION, epsilon=1e9, delta=0.5)
        rec.record_release(bundle, population=SIMULATED_POPULATION)
        return rec.issue_receipt(bundle)
