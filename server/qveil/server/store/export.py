"""Export and import of one release as JSON Lines, verified on import.

Format (one JSON object per line; floats written by ``repr``, so every x and g round-trips
bit for bit):

    {"type": "release", "format": "qveil.noise.v1", ...ReleaseRecord fields...}
    {"type": "point", "action": a, "coordinate": j, "seq": s, "x": x, "g": g,
     "created_at": t, "hash": h}
    ...                                      (in (action, coordinate, seq) order)
    {"type": "end", "counts": {"p": n, ...}, "heads": {"p": hash, ...}}

Every release is one of d >= 1 coordinates (header ``dims``; ``betas``, empty for d = 1
whose rate is ``beta``): ``counts`` and ``heads`` are keyed by the path index p = a * d + j
(d = 1: p = a, j = 0). Import reads a point without ``coordinate`` as coordinate 0 (files
written before every point named it).

Import checks, before writing anything: the format tag, every field, the end record (counts
and head hashes: a truncated file is refused), seqs 1..n without gaps per action, states in
[0, 1] and unique per action, finite values, and every chain link under the importing
store's key. Then the release and all rows are written in one transaction. An export is a
copy of a log, not a move: the values are the release's key's, so any copy of a release
answers with them (``qveil audit`` checks a log against the key).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from qveil.errors import IntegrityError, InvalidArgument
from qveil.json_types import JSONObject
from qveil.server.store.base import (
    ImportedRelease,
    ReleaseRecord,
    Row,
)
from qveil.server.store.integrity import verify_chain
from qveil.server.store.releases import new_record

if TYPE_CHECKING:
    from qveil.server.store.base import SamplePathStore

__all__ = ["FORMAT", "export_release", "import_release", "read_export_header"]

FORMAT = "qveil.noise.v1"


def export_release(
    store: SamplePathStore,
    release_id: str,
    path: str | os.PathLike[str],
) -> int:
    """Write ``release_id`` to ``path`` (atomically: temp file + rename); returns point count.
    The file is 0600 whatever the umask: it holds the release's logged noise."""
    rec = store.releases.get_release(release_id)
    dest = Path(path)
    tmp = dest.with_name(dest.name + ".tmp")
    counts: dict[str, int] = {}
    heads: dict[str, str] = {}
    n = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover temp file keeps its old mode through O_TRUNC
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        head = {"type": "release", "format": FORMAT, **rec.to_dict()}
        f.write(json.dumps(head) + "\n")
        for a, (seq, x, g, c, h) in store._db_iter_rows(release_id, None):
            # path a is (action, coordinate) = divmod(a, dims)
            key = dict(zip(("action", "coordinate"), rec.split(a), strict=True))
            f.write(
                json.dumps(
                    {
                        "type": "point",
                        **key,
                        "seq": seq,
                        "x": x,
                        "g": g,
                        "created_at": c,
                        "hash": h,
                    }
                )
                + "\n"
            )
            counts[str(a)] = counts.get(str(a), 0) + 1
            heads[str(a)] = h
            n += 1
        f.write(json.dumps({"type": "end", "counts": counts, "heads": heads}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    return n


def read_export_header(path: str | os.PathLike[str]) -> JSONObject:
    """The first line of an export (its release header), checked for the format tag."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        d = json.loads(first)
    except OSError as exc:
        raise InvalidArgument(f"cannot read export {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"line 1: not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("type") != "release" or d.get("format") != FORMAT:
        raise InvalidArgument(f"line 1: not a {FORMAT} export (no release header)")
    return d


def _num(d: JSONObject, k: str, line: int) -> float:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InvalidArgument(f"line {line}: field {k!r} must be a finite number, got {v!r}")
    return float(v)


def _release_header(d: JSONObject, i: int) -> ReleaseRecord:
    """The release record of an export's header line ``i``."""
    try:
        rec = new_record(
            release_id=d["release_id"],
            fingerprint=d["fingerprint"],
            sigma=d["sigma"],
            beta=d["beta"],
            interval=tuple(d["interval"]),
            n_actions=d["n_actions"],
            status=d["status"],
            betas=d.get("betas"),
            created_at=datetime.now(UTC),
        )
        created = datetime.fromisoformat(d["created_at"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"line {i}: bad release header: {exc}") from None
    return replace(rec, created_at=created)


def _point_row(d: JSONObject, i: int, rec: ReleaseRecord) -> tuple[int, Row]:
    """The path index and stored row of an export's point line ``i``."""
    a = d.get("action")
    j = d.get("coordinate", 0)
    seq = d.get("seq")
    if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < rec.n_actions:
        raise InvalidArgument(f"line {i}: bad action {a!r}")
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < rec.dims:
        raise InvalidArgument(f"line {i}: bad coordinate {j!r}")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise InvalidArgument(f"line {i}: bad seq {seq!r}")
    h = d.get("hash")
    if not isinstance(h, str) or len(h) != 64:
        raise InvalidArgument(f"line {i}: bad hash {h!r}")
    return rec.path(a, j), (seq, _num(d, "x", i), _num(d, "g", i), _num(d, "created_at", i), h)


def _verify_rows(
    store: SamplePathStore,
    path: str | os.PathLike[str],
    rec: ReleaseRecord,
    rows: dict[int, list[Row]],
    end: JSONObject,
) -> None:
    """IntegrityError unless the rows match the end record's counts and heads and every
    path's hash chain verifies under this store's key."""
    counts = {str(a): len(r) for a, r in rows.items()}
    heads = {str(a): r[-1][4] for a, r in rows.items() if r}
    if counts != end.get("counts") or heads != end.get("heads"):
        raise IntegrityError(f"{path}: counts or head hashes differ from the end record")
    for a, rs in sorted(rows.items()):
        rep = verify_chain(
            rec.release_id, a, ((s, x, g, h) for s, x, g, _c, h in rs), store._hasher
        )
        if not rep.ok:
            raise IntegrityError(
                f"{path}: action {a} fails verification: "
                + "; ".join(rep.problems)
                + (" (was it exported under another server key?)" if store._hasher.keyed else "")
            )


def import_release(store: SamplePathStore, path: str | os.PathLike[str]) -> ReleaseRecord:
    """Verify ``path`` completely, then store its release and points in one transaction."""
    rec: ReleaseRecord | None = None
    rows: dict[int, list[Row]] = {}
    end: JSONObject | None = None
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise InvalidArgument(f"cannot read export {path}: {exc}") from None
    with f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if end is not None:
                raise InvalidArgument(f"line {i}: data after the end record")
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"line {i}: not JSON: {exc}") from None
            t = d.get("type") if isinstance(d, dict) else None
            if i == 1 or rec is None:
                if t != "release" or d.get("format") != FORMAT:
                    raise InvalidArgument(f"line {i}: not a {FORMAT} export (no release header)")
                rec = _release_header(d, i)
            elif t == "point":
                a, row = _point_row(d, i, rec)
                rows.setdefault(a, []).append(row)
            elif t == "end":
                end = d
            else:
                raise InvalidArgument(f"line {i}: unknown record type {t!r}")
    if rec is None:
        raise InvalidArgument(f"{path}: empty export")
    if end is None:
        raise IntegrityError(f"{path}: no end record: the export is truncated")
    _verify_rows(store, path, rec, rows, end)
    store._db_import(ImportedRelease(rec, rows))
    return store.releases.get_release(rec.release_id)
