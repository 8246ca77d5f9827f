"""The records a release is kept in, as the trainer sees them: the population's privacy
ledger and the signed receipt of a release's charge.

The trainer (``qveil train``, ``qveil evaluate --private``) must charge what it releases to the
population whose data it used, and have each bundle it writes carry the registry's receipt of
that charge before anyone can serve it. Those records live in the server's registry, but the
trainer stands below the server and never imports it: it talks to this protocol, the server
implements it (:mod:`qveil.server.governance.release_records`), and the composition root
(:mod:`qveil.cli`) passes the implementation to the trainer's commands when they run.

Every method refuses with a :class:`qveil.errors.QveilError` (``FailedPrecondition`` for a
population that is not declared, ``BudgetExceeded`` past its budget), and a refusal writes
nothing.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.ledger import PrivacyEvent

__all__ = ["MAX_POPULATION_NAME", "OpenReleaseRecords", "ReleaseRecords", "validate_population"]

MAX_POPULATION_NAME = 200


def validate_population(name: object) -> str:
    """A population name: 1-200 printable characters, no leading or trailing space."""
    if (
        not isinstance(name, str)
        or not name
        or name != name.strip()
        or len(name) > MAX_POPULATION_NAME
    ):
        raise InvalidArgument(
            f"a population name is 1-{MAX_POPULATION_NAME} characters without surrounding "
            f"spaces, got {echo(str(name))}"
        )
    if not name.isprintable():
        raise InvalidArgument(f"population name {echo(name)} has unprintable characters")
    return name


class ReleaseRecords(Protocol):
    """One open registry: the population ledger and the receipts it signs."""

    @property
    def url(self) -> str:
        """Where the records are (for messages; no credentials)."""
        ...

    def population_report(self, population: str) -> JSONObject:
        """The population's budget, what its releases spent under its privacy filter and what
        one more release may still have (FailedPrecondition when it is not declared)."""
        ...

    def precheck(self, population: str, event: PrivacyEvent) -> JSONObject:
        """Refuse a planned event the population's filter would not let through; run before
        any private data is read. Returns the filter's state with the event added."""
        ...

    def record_release(self, bundle: Path, *, population: str | None) -> str:
        """Charge the written bundle's release (its privacy recomputed by the accountant from
        its own card) to ``population`` (None: the card's dataset), atomically filtered
        again. Returns one line for the operator."""
        ...

    def issue_receipt(self, bundle: Path) -> str:
        """Sign the receipt of the written bundle's recorded charge and write it into the
        bundle (``receipt.json``, what ``qveil serve`` verifies). Returns one line for the
        operator."""
        ...

    def record_evaluation(
        self, population: str, event: PrivacyEvent, *, target: str, params: JSONMapping
    ) -> None:
        """Charge a private evaluation of release ``target`` to ``population`` (filtered and
        appended atomically) and append it to the audit log with ``params``."""
        ...


class OpenReleaseRecords(Protocol):
    """Opens the records at ``url`` (None: the default registry) for ``actor``."""

    def __call__(
        self, url: str | None, *, actor: str
    ) -> AbstractContextManager[ReleaseRecords]: ...
