"""One release, one noise lineage: the checks every start, activation and bind runs first.

A release's noise is one draw of a Gaussian process, kept in one store. Any second store, or
second copy of its store, asked for the same release would draw a second, independent path
at new states; a client averaging k such servers shrinks the noise by sqrt(k) and the
privacy guarantee is gone. So a release is served only when all of these hold:

* the bundle's ``binding.json`` (written by ``qveil train`` with the bundle; checksummed) names
  this release and fingerprint and the registry in use (:class:`qveil.bundle.Binding`);
* this store is the file or database it was created as, not a byte copy, clone or restore
  into a new file (:meth:`~qveil.server.store.SamplePathStore.incarnation`; a copy must be
  adopted first: ``qveil admin adopt-store``);
* the registry (:mod:`qveil.server.registry`) records the release's noise as living in this
  store and this incarnation, and not as exported or retired;
* the store's chains contain every chain head the registry witnessed, i.e. every value ever
  answered (a restored backup that lost answered points is refused).

A bundle the library wrote without a binding (tests, experiments) is bound by its first
start, and only when the registry has never seen the release: the registry's one claim per
release decides, so two copies of such a bundle cannot both be bound. The registry is claimed
first, then the store records the binding, then ``binding.json`` is written: a crash in
between leaves a claim that the next start of the same store completes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qveil.bundle import Binding, read_binding, release_fingerprint, write_binding
from qveil.errors import FailedPrecondition, IntegrityError, echo

__all__ = ["bind", "check_binding", "copy_refusal"]


def copy_refusal(store: Any) -> FailedPrecondition | None:
    """The refusal of a store that is not the incarnation it records (None when it is)."""
    inc = store.incarnation()
    if inc.original:
        return None
    return FailedPrecondition(
        f"store {store.store_id} ({echo(str(getattr(store, '_identity', '')))}) is a copy: it "
        f"was created as {inc.recorded} and is now {inc.current} (a byte copy, a database "
        "cloned from a template, or a backup restored into a new file). A copy answers "
        "nothing, because it would draw a second noise path at new states. If this copy is to "
        "be the live store from now on, adopt it (qveil admin adopt-store --store URL): the "
        "other copies then stop serving"
    )


def check_binding(store: Any, bundle: Any, path: Path, registry: Any) -> tuple[str, Binding | None]:
    """Refuse (FailedPrecondition / IntegrityError, nothing written) a bundle this store may
    not serve (see the module docstring); returns the bundle's fingerprint and its binding
    (None: a library bundle never bound)."""
    rid = bundle.bundle_id
    fingerprint = release_fingerprint(path)
    on_file = read_binding(path)
    if on_file is not None:
        if on_file.release_id != rid or on_file.fingerprint != fingerprint:
            raise IntegrityError(
                f"bundle {echo(str(path))}: binding.json belongs to release "
                f"{echo(on_file.release_id)} with fingerprint {on_file.fingerprint[:16]}..., but "
                f"the bundle is release {echo(rid)} with fingerprint {fingerprint[:16]}... (a "
                "binding copied from another bundle, or the bundle was changed after binding)"
            )
        if on_file.registry_id != registry.registry_id:
            raise FailedPrecondition(
                f"release {echo(rid)} is recorded in registry {on_file.registry_id}, and this "
                f"process uses registry {registry.registry_id} ({echo(registry.url)}): point "
                "QVEIL_REGISTRY (or --registry) at the registry the release was trained with"
            )
    refusal = copy_refusal(store)
    if refusal is not None:
        raise refusal
    held = store.get_binding(rid)
    if held is not None and held.fingerprint != fingerprint:
        raise FailedPrecondition(
            f"this store holds release {echo(rid)} with fingerprint {held.fingerprint[:16]}..., "
            f"but the bundle's fingerprint is {fingerprint[:16]}...: a different bundle under "
            "the same release id is never served from this store's noise"
        )
    rec = registry.lineage(rid)
    if rec is None:
        if on_file is not None:
            raise FailedPrecondition(
                f"release {echo(rid)} is bound (binding.json), but registry "
                f"{echo(registry.url)} has no record of it: the registry was replaced or "
                "lost. Restore the registry; a release whose record is lost can only be retired"
            )
    else:
        registry.check(
            rec,
            fingerprint=fingerprint,
            store_id=store.store_id,
            incarnation=store.incarnation().token,
        )
        if held is not None:
            behind = registry.behind(store, rid)
            if behind:
                raise FailedPrecondition(
                    f"store {store.store_id} is behind what release {echo(rid)} has answered "
                    f"({'; '.join(behind[:3])}): it is a restored backup or a fork, and serving "
                    "it would give new values at answered states. Serve the store that holds "
                    "every answer, or retire the release (qveil admin adopt-store --store URL "
                    "--retire-behind)"
                )
    return fingerprint, on_file


def bind(
    store: Any,
    bundle: Any,
    path: Path,
    fingerprint: str,
    on_file: Binding | None,
    registry: Any,
) -> bool:
    """Record the binding: the registry's claim, then the store's record, then
    ``binding.json`` when it does not name this store yet. True when the file was written."""
    rid = bundle.bundle_id
    sid = store.store_id
    where = str(getattr(store, "_identity", ""))
    registry.claim(
        release_id=rid,
        fingerprint=fingerprint,
        store_id=sid,
        incarnation=store.incarnation().token,
        store=where,
    )
    store.bind_release(rid, fingerprint)
    if on_file is not None and on_file.store_id == sid:
        return False
    try:
        write_binding(
            path,
            Binding(
                release_id=rid,
                fingerprint=fingerprint,
                store_id=sid,
                store=where,
                bound_at=datetime.now(UTC).isoformat(timespec="seconds"),
                registry_id=registry.registry_id,
            ),
        )
    except OSError as exc:
        raise FailedPrecondition(
            f"cannot record the binding of release {echo(rid)} in bundle {echo(str(path))} "
            f"({exc.strerror or exc}): the bundle directory must be writable when it is bound "
            "(qveil train binds it; qveil admin init-store --store URL --bundle DIR binds a "
            "bundle the library wrote)"
        ) from None
    return True
