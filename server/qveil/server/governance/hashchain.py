"""Hash chains for the append-only admin records (privacy ledger, admin audit log).

Pure functions, no I/O. Each record's hash is SHA-256 over the previous record's hash and a
canonical JSON encoding of the record's fields (sorted keys, no whitespace, floats written by
``repr`` so they round-trip exactly). Editing, deleting or reordering any record breaks the link
of every record after it; deleting the *newest* records is caught by cross-references (each
ledger entry is referenced from the audit log, and audits record high-water marks), see
``docs/operations.md``, "Audits".

A chain detects accidental and naive changes. Someone with write access who recomputes the whole
chain is caught only against a copy of a head hash kept elsewhere (the audit log's anchors, an
exported report); that limit is documented, not hidden.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping

from qveil.json_types import JSONMapping, JSONValue

__all__ = ["GENESIS", "canonical_json", "link_hash"]

#: The "previous hash" of the first record of a chain.
GENESIS = "0" * 64


def _check_finite(obj: JSONValue, path: str = "$") -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"non-finite number at {path}: {obj!r} (not representable in a record)")
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _check_finite(v, f"{path}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _check_finite(v, f"{path}[{i}]")


def canonical_json(obj: JSONValue) -> str:
    """Deterministic JSON text of ``obj``: sorted keys, compact separators, exact floats.

    Python's ``json`` writes floats with ``repr`` (shortest round-trip form), so encoding,
    decoding and re-encoding gives the same text; NaN and infinities are refused.
    """
    _check_finite(obj)
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def link_hash(prev_hash: str, fields: JSONMapping) -> str:
    """SHA-256 hex of ``prev_hash`` followed by the canonical JSON of ``fields``."""
    if len(prev_hash) != 64:
        raise ValueError(f"previous hash must be 64 hex characters, got {prev_hash!r}")
    h = hashlib.sha256()
    h.update(prev_hash.encode("ascii"))
    h.update(b"\n")
    h.update(canonical_json(dict(fields)).encode("utf-8"))
    return h.hexdigest()
