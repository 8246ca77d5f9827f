"""``binding.json``: the store that holds a release's noise and the registry that records it
(one release, one noise lineage), and the release fingerprint it is bound to."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from qveil.bundle.layout import BINDING_FILE, WEIGHTS_FILE, sha256_file
from qveil.errors import IntegrityError

__all__ = ["BINDING_FORMAT", "Binding", "read_binding", "release_fingerprint", "write_binding"]

BINDING_FORMAT = "qveil.binding.v2"


def release_fingerprint(path: str | Path) -> str:
    """sha256 over the bundle's model and card files: ``weights.npz`` and every ``*.json`` of
    the bundle except ``binding.json`` (so a card split into several files is covered too),
    each as ``name NUL sha256(content) LF`` in name order. Two bundles with the same release id
    but any other weights or card have different fingerprints; binding the bundle does not
    change it."""
    p = Path(path)
    names = [WEIGHTS_FILE] + sorted(
        f.name for f in p.glob("*.json") if f.is_file() and f.name != BINDING_FILE
    )
    h = hashlib.sha256(b"qveil.release-fingerprint.v1\n")
    for name in names:
        h.update(f"{name}\0{sha256_file(p / name)}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Binding:
    """``binding.json``: the store that holds this release's noise, and the registry that
    records it (one release, one noise lineage: ``qveil.server.registry``). Written by
    ``qveil train`` with the bundle, or by the first bind of a bundle the library wrote;
    rewritten only by a legitimate move (an import). Its ``checksum`` covers every field and
    the release fingerprint, so a copied, edited or deleted binding is refused."""

    release_id: str
    fingerprint: str
    store_id: str
    store: str  # the store URL at binding time, password redacted (for people, not checked)
    bound_at: str
    registry_id: str

    def checksum(self) -> str:
        h = hashlib.sha256(b"qveil.binding.v2\n")
        for k in _BINDING_KEYS:
            h.update(f"{k}\0{getattr(self, k)}\n".encode())
        return h.hexdigest()

    def to_dict(self) -> dict[str, str]:
        return {
            "format": BINDING_FORMAT,
            **{k: getattr(self, k) for k in _BINDING_KEYS},
            "checksum": self.checksum(),
        }


_BINDING_KEYS = ("release_id", "fingerprint", "store_id", "store", "bound_at", "registry_id")


def read_binding(path: str | Path) -> Binding | None:
    """The bundle's binding, or None when it has none (or only a binding of the earlier,
    unchecksummed format, which the registry's record replaces). A present but malformed or
    edited file is an IntegrityError (never silently treated as unbound)."""
    f = Path(path) / BINDING_FILE
    if not f.exists():
        return None
    try:
        d = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"bundle {str(path)!r}: {BINDING_FILE} is unreadable: {exc}") from None
    if isinstance(d, dict) and d.get("format") == "qveil.binding.v1":
        return None
    if (
        not isinstance(d, dict)
        or d.get("format") != BINDING_FORMAT
        or not all(isinstance(d.get(k), str) for k in (*_BINDING_KEYS, "checksum"))
    ):
        raise IntegrityError(
            f"bundle {str(path)!r}: {BINDING_FILE} is not a {BINDING_FORMAT} record"
        )
    b = Binding(*(str(d[k]) for k in _BINDING_KEYS))
    if b.checksum() != d["checksum"]:
        raise IntegrityError(
            f"bundle {str(path)!r}: {BINDING_FILE} was edited (its checksum does not match): a "
            "binding is written only by qveil train, the first bind, or qveil admin "
            "import-release"
        )
    return b


def write_binding(path: str | Path, binding: Binding) -> None:
    """Write ``binding.json`` atomically and durably: a unique temporary file, fsync, rename over
    the old name, fsync of the directory. Concurrent writers of the same binding (replicas
    starting together) are harmless: each rename installs a complete file."""
    p = Path(path)
    tmp = p / f".{BINDING_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with tmp.open("w") as fh:
            fh.write(json.dumps(binding.to_dict(), indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p / BINDING_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
