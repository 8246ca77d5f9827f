"""The registry as the trainer's release records (:class:`qveil.release_records.ReleaseRecords`):
the population ledger, the audit log and the binding of a written bundle to its store.

The trainer never imports the server; the composition root (:mod:`qveil.cli`) passes
:func:`open_release_records` to ``qveil train`` and ``qveil evaluate`` when they run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qveil.bundle import load_bundle
from qveil.privacy.ledger import PrivacyEvent
from qveil.release_records import validate_population
from qveil.server import audit_log
from qveil.server import population as pop
from qveil.server.admin import bind_bundle, open_admin
from qveil.server.registry import Registry, open_registry
from qveil.server.release_ledger import record_release

__all__ = ["RegistryRecords", "open_release_records"]


class RegistryRecords:
    """:class:`qveil.release_records.ReleaseRecords` over one open :class:`Registry`."""

    def __init__(self, registry: Registry, *, url: str | None) -> None:
        self.registry = registry
        self._url = url  # as given: bind_release opens the same registry for the store

    @property
    def url(self) -> str:
        return str(self.registry.url)

    def population_report(self, population: str) -> dict[str, Any]:
        return pop.report(self.registry, validate_population(population))

    def precheck(self, population: str, event: PrivacyEvent) -> dict[str, Any]:
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
            f"privacy: population {population} spent eps={rep['spent']['epsilon']:.6g} at "
            f"delta={rep['spent']['delta']:.3g} of its budget eps={rep['budget']['epsilon']:g}; "
            f"one more release may have eps <= {rep['remaining']['epsilon']:.6g} "
            f"({len(rep['events'])} release(s); {rep['rule'].split(':')[0]}) [{where}]"
        )

    def bind_release(self, bundle: Path, *, store_url: str | None) -> str:
        url = store_url or f"sqlite:///{bundle.resolve().parent / 'qveil-store.sqlite'}"
        with open_admin(url, actor=self.registry.actor) as ctx:
            ctx.registry_url = self._url
            out = bind_bundle(ctx, bundle)
        return f"bound: release {out['release_id']} to store {out['store_id']} [{url}]"

    def record_evaluation(
        self, population: str, event: PrivacyEvent, *, target: str, params: Mapping[str, Any]
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
