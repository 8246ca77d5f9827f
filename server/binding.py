"""One release, one store (issue 14, item 2): bind a release to the store that holds its noise.

A release's noise is one draw of a Gaussian process, kept in one store. A second store asked
for the same release would draw a second, independent path; a client averaging the answers of
k such servers shrinks the noise by sqrt(k) and the privacy guarantee is gone. So:

* the first time a release is served, it is bound on both sides: the store records the
  release's fingerprint (``release_bindings``; :func:`qveil.bundle.release_fingerprint`, a hash
  of the model and card files) and the bundle records the store's random persistent id
  (``binding.json``, written atomically, not part of the fingerprint);
* from then on a start is refused when the bundle is bound and the store does not hold the
  release (an empty, new, re-created or different store), and whenever the store holds the
  release id under another fingerprint;
* the only way to another store is explicit: ``qveil admin export-release`` /
  ``import-release`` carry the stored points and the store's binding; a bundle bound to the
  old store is then re-bound to the store that now holds its release. Replicas share noise
  through one shared store (PostgreSQL), whose id they all see.

The store side is written first: a crash between the two writes leaves a store that holds the
release and an unbound bundle, which the next start binds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qveil.bundle import Binding, read_binding, release_fingerprint, write_binding
from qveil.errors import FailedPrecondition, IntegrityError, echo

__all__ = ["bind", "check_binding"]


def check_binding(store: Any, bundle: Any, path: Path) -> tuple[str, Binding | None]:
    """Refuse (FailedPrecondition / IntegrityError, nothing written) a bundle this store may not
    serve; returns the bundle's fingerprint and its binding (None: never served)."""
    rid = bundle.bundle_id
    fingerprint = release_fingerprint(path)
    on_file = read_binding(path)
    held = store.get_binding(rid)
    if on_file is not None:
        if on_file.release_id != rid or on_file.fingerprint != fingerprint:
            raise IntegrityError(
                f"bundle {echo(str(path))}: binding.json belongs to release "
                f"{echo(on_file.release_id)} with fingerprint {on_file.fingerprint[:16]}..., but "
                f"the bundle is release {echo(rid)} with fingerprint {fingerprint[:16]}... (a "
                "binding copied from another bundle, or the bundle was changed after binding)"
            )
        if held is None:
            raise FailedPrecondition(
                f"release {echo(rid)} is bound to store {on_file.store_id} "
                f"({echo(on_file.store)}, since {on_file.bound_at}), and this store (id "
                f"{store.store_id}) does not hold it: serving it here would draw a second, "
                "independent noise path under the same release. Serve it with the store that "
                "holds it, or move it there explicitly (qveil admin export-release / "
                "import-release). If that store is lost, the release can only be retired."
            )
    if held is not None and held.fingerprint != fingerprint:
        raise FailedPrecondition(
            f"this store holds release {echo(rid)} with fingerprint {held.fingerprint[:16]}..., "
            f"but the bundle's fingerprint is {fingerprint[:16]}...: a different bundle under "
            "the same release id is never served from this store's noise"
        )
    return fingerprint, on_file


def bind(store: Any, bundle: Any, path: Path, fingerprint: str, on_file: Binding | None) -> bool:
    """Record the binding on both sides (store first, then ``binding.json``); True when the
    bundle's binding file was (re)written."""
    rid = bundle.bundle_id
    store.bind_release(rid, fingerprint)
    sid = store.store_id
    if on_file is not None and on_file.store_id == sid:
        return False
    try:
        write_binding(
            path,
            Binding(
                release_id=rid,
                fingerprint=fingerprint,
                store_id=sid,
                store=str(getattr(store, "_identity", "")),
                bound_at=datetime.now(UTC).isoformat(timespec="seconds"),
            ),
        )
    except OSError as exc:
        raise FailedPrecondition(
            f"cannot record the binding of release {echo(rid)} in bundle {echo(str(path))} "
            f"({exc.strerror or exc}): the bundle directory must be writable on its first "
            "serve (or bind it beforehand: qveil admin init-store --store URL --bundle DIR)"
        ) from None
    return True
