"""The release-management service: what AdminService does (activate, retire, list, stats,
budgets, the admin card) and the server's start, which loads and verifies a bundle, checks
the registry's signed receipt of its charge and registers it in the answer log's store before
anything of it is answered."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from qveil.bundle import Bundle, load_bundle
from qveil.bundle.receipt import Receipt, check_receipt
from qveil.common import typing as t
from qveil.errors import (
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    bad_argument,
    echo,
)
from qveil.json_types import JSONObject
from qveil.privacy.ledger import spending_line
from qveil.server.governance import audit_log
from qveil.server.governance.population import report as population_report
from qveil.server.serving import views
from qveil.server.serving.state import ActiveRelease, ContextService, ServerContext
from qveil.server.store.releases import ReleaseRecord

__all__ = ["ReleaseService"]


class ReleaseService(ContextService):
    """Activation, retirement and listings of releases, server stats, budgets, admin cards."""

    def __init__(
        self,
        ctx: ServerContext,
        *,
        bundle_dirs: Sequence[str | Path] = (),
        trusted_keys: Sequence[str] = (),
    ) -> None:
        super().__init__(ctx)
        #: registry public keys whose receipts are trusted besides the server's own registry's
        self.trusted_keys = tuple(trusted_keys)
        #: the receipt of the served release (``qveil serve`` says what it was charged)
        self.last_receipt: Receipt | None = None
        #: release id -> bundle directory, for activation by id and for cards in listings
        self.known_bundles: dict[str, Path] = {}
        self.bundle_dirs = [Path(d) for d in bundle_dirs]
        self._cards: dict[str, t.Release] = {}

    def load(self, path: Path) -> tuple[Bundle, Receipt]:
        """The bundle at ``path``, verified, with its receipt verified against the registry
        keys this server trusts (its registry's and ``--trust-registry-key``): a release is
        served only if its charge is recorded. Raises before anything is stored."""
        bundle = load_bundle(path, verify=True)
        card = bundle.card
        receipt = check_receipt(
            path,
            release_id=bundle.bundle_id,
            key_sha256=str(card["key_sha256"]),
            weights_sha256=str(card["weights_sha256"]),
            card_sha256=str(card["card_sha256"]),
            trusted=(self.registry.public_key, *self.trusted_keys),
        )
        return bundle, receipt

    def start(
        self,
        bundle_path: str | Path,
        *,
        verify_store: bool = True,
        loaded: tuple[Bundle, Receipt] | None = None,
    ) -> ActiveRelease:
        """Server start: load and verify the bundle and its receipt (``loaded``: what
        :meth:`load` returned for it already), register its release in the store if absent,
        verify the store's log of it, mark it active and make it the served release."""
        return self._activate(
            Path(bundle_path), expected_id="", verify_store=verify_store, loaded=loaded
        )

    def _activate(
        self,
        path: Path,
        *,
        expected_id: str,
        verify_store: bool,
        loaded: tuple[Bundle, Receipt] | None = None,
    ) -> ActiveRelease:
        with self.holder.activation_lock:
            bundle, receipt = self.load(path) if loaded is None else loaded
            if expected_id and bundle.bundle_id != expected_id:
                raise InvalidArgument(
                    f"bundle {echo(str(path))} holds release {bundle.bundle_id!r}, not "
                    f"{echo(expected_id)}"
                )
            rec = self.releases.register_bundle(bundle)
            if getattr(rec, "status", "") == "retired":
                raise FailedPrecondition(
                    f"release {bundle.bundle_id!r} is retired; retired "
                    "releases are never answered again"
                )
            if verify_store:
                report = self.store.verify(bundle.bundle_id)
                if not bool(getattr(report, "ok", True)):
                    raise IntegrityError(
                        f"stored noise of release {bundle.bundle_id!r} fails verification: {report}"
                    )
            self.last_receipt = receipt
            previous = self.holder.peek()
            if previous is None or previous.release_id != bundle.bundle_id:
                self.releases.set_release_status(bundle.bundle_id, "active")
            rec = self.releases.get_release(bundle.bundle_id)
            new = ActiveRelease(bundle=bundle, record=rec)
            self.holder.swap(new)
            if previous is not None and previous.release_id != new.release_id:
                self.releases.set_release_status(previous.release_id, "staged")
            # other releases still marked active (an earlier process) become staged
            for other in self.releases.list_releases():
                if other.release_id != new.release_id and other.status == "active":
                    self.releases.set_release_status(other.release_id, "staged")
            self.known_bundles[bundle.bundle_id] = path.resolve()
            self._cards.pop(bundle.bundle_id, None)
            return new

    def spending(self, population: str) -> str:
        """One line: the population's spending and what one more release may have, the same
        figure ``qveil budget show`` and ``qveil admin budget`` print (its privacy filter)."""
        if self.registry.ledger.cap(population) is None:
            return (
                f"population {population}: not declared in registry {self.registry.url} "
                "(its receipt is trusted; its spending is in the registry that charged it)"
            )
        return spending_line(population, population_report(self.registry, population))

    def _find_bundle(self, release_id: str) -> Path:
        if release_id in self.known_bundles:
            return self.known_bundles[release_id]
        roots = {p.parent for p in self.known_bundles.values()} | set(self.bundle_dirs)
        for root in sorted(roots):
            for card in sorted(root.glob("*/card.json")):
                try:
                    if json.loads(card.read_text()).get("bundle_id") == release_id:
                        self.known_bundles[release_id] = card.parent.resolve()
                        return card.parent
                except (OSError, ValueError):
                    continue
        raise NotFound(
            f"no bundle for release {echo(release_id)} on this server (give "
            "bundle_path, or put the bundle beside the served one)"
        )

    def activate(self, release_id: str = "", bundle_path: str = "") -> tuple[t.Release, str]:
        with audit_log.server_action(
            self.store,
            "activate",
            release_id or bundle_path,
            release_id=release_id,
            bundle_path=bundle_path,
        ):
            return self._activate_request(release_id, bundle_path)

    def _activate_request(self, release_id: str, bundle_path: str) -> tuple[t.Release, str]:
        if not release_id and not bundle_path:
            raise bad_argument(
                "give release_id or bundle_path", field="release_id", reason="MISSING_RELEASE"
            )
        previous = self.holder.peek()
        path = Path(bundle_path) if bundle_path else self._find_bundle(release_id)
        new = self._activate(path, expected_id=release_id, verify_store=True)
        return (
            views.release_from_bundle(
                new.bundle, record=new.record, value_grid=self.limits.value_grid
            ),
            previous.release_id if previous is not None else "",
        )

    def retire(self, release_id: str) -> t.Release:
        with audit_log.server_action(self.store, "retire", release_id, release_id=release_id):
            return self._retire_request(release_id)

    def _retire_request(self, release_id: str) -> t.Release:
        if not release_id:
            raise bad_argument(
                "release_id is required", field="release_id", reason="MISSING_RELEASE"
            )
        with self.holder.activation_lock:
            current = self.holder.peek()
            if current is not None and current.release_id == release_id:
                raise FailedPrecondition(
                    f"release {echo(release_id)} is active; activate another release before "
                    "retiring it"
                )
            self.releases.get_release(release_id)  # NotFound
            self.releases.set_release_status(release_id, "retired")
            self._cards.pop(release_id, None)
            return self._describe(self.releases.get_release(release_id))

    def _describe(self, record: ReleaseRecord) -> t.Release:
        rid = str(record.release_id)
        path = self.known_bundles.get(rid)
        if path is None:
            try:
                path = self._find_bundle(rid)
            except NotFound:
                path = None
        if path is not None:
            try:
                base = self._cards.get(rid)
                if base is None:
                    bundle = load_bundle(path, verify=False)
                    base = views.release_from_bundle(
                        bundle, record=None, value_grid=self.limits.value_grid
                    )
                    self._cards[rid] = base
                return replace(base, status=str(record.status))
            except Exception:  # noqa: BLE001 - a listing shows what the store knows
                pass
        return views.release_from_record(record, value_grid=self.limits.value_grid)

    def list_releases(self) -> tuple[list[t.Release], str]:
        current = self.holder.peek()
        return (
            [self._describe(r) for r in self.releases.list_releases()],
            current.release_id if current is not None else "",
        )

    def stats(self) -> t.ServerStats:
        current = self.holder.peek()
        stored = {a: n for (_r, a), n in self.stored_points().items()}
        m = self.metrics
        return t.ServerStats(
            active_release_id=current.release_id if current is not None else "",
            uptime_seconds=m.uptime(),
            requests_by_code=dict(m.requests),
            states_answered=m.states_answered,
            new_points=0 if m.answer_log is None else int(m.answer_log.logged),
            in_flight=m.in_flight,
            max_in_flight=self.limits.max_in_flight,
            stored_points=stored,
            max_batch=self.limits.max_batch,
        )

    def budget(self, dataset_id: str = "") -> list[dict[str, object]]:
        """Budgets of one population (or all) in the registry's ledger."""
        return [b.to_dict() for b in self.registry.ledger.budgets(dataset_id or None)]

    def admin_card(self, release_id: str = "") -> tuple[str, JSONObject, JSONObject]:
        """(release id, public card, admin card) of the active release or of ``release_id``
        (a bundle this server knows): the admin role's view."""
        current = self.holder.peek()
        if not release_id or (current is not None and current.release_id == release_id):
            rel = self.holder.current()
            bundle = rel.bundle
        else:
            self.releases.get_release(release_id)  # NotFound for an unknown release
            bundle = load_bundle(self._find_bundle(release_id), verify=True)
        admin = bundle.admin_card()
        # the private evaluations of this release (qveil evaluate --private), from the
        # registry's audit log: what the released policy is worth, with its interval
        evaluations = [
            {"at": e.at, "actor": e.actor, **e.params}
            for e in audit_log.entries(
                self.registry.db, action="private-evaluation", target=bundle.bundle_id
            )
        ]
        if evaluations:
            admin["private_evaluations"] = evaluations
        return bundle.bundle_id, bundle.public_card(), admin

    def stored_points(self) -> dict[tuple[str, int], int]:
        current = self.holder.peek()
        if current is None:
            return {}
        d = int(current.bundle.dims)  # d > 1: an action's points are its d paths'
        return {
            (current.release_id, a): sum(
                int(self.store.count_points(current.release_id, a * d + j)) for j in range(d)
            )
            for a in range(current.bundle.n_actions)
        }
