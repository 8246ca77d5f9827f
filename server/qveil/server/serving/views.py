"""The API's view of the server's domain objects (bundle, store records, integrity reports).

The API types and their protobuf mapping live in the wire layer (``qveil.common.typing`` /
``qveil.common.serde``, one mapping shared by server and SDK); this module only builds those
types from the server-side domain objects, so generated classes never reach the store or the
bundle code.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from qveil.common import typing as t
from qveil.json_types import JSONValue

if TYPE_CHECKING:  # for annotations only: the views import no bundle or store code
    from qveil.bundle import Bundle
    from qveil.server.store.base import StoredPoint
    from qveil.server.store.integrity import IntegrityReport
    from qveil.server.store.releases import ReleaseRecord

__all__ = ["integrity_from_report", "noise_point", "release_from_bundle", "release_from_record"]


def _f(v: JSONValue, default: float = math.nan) -> float:
    try:
        return float(v) if v is not None else default
    except (TypeError, ValueError):
        return default


def _when(v: object) -> datetime | None:
    if v is None or v == "":
        return None
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    if isinstance(v, int | float):
        return datetime.fromtimestamp(float(v), UTC)
    try:
        d = datetime.fromisoformat(str(v))
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def _status(record: object) -> str:
    return str(getattr(record, "status", "") or "") if record is not None else ""


def release_from_bundle(
    bundle: Bundle, *, record: ReleaseRecord | None = None, value_grid: float
) -> t.Release:
    """The public view of a loaded bundle: ``bundle.public_card()`` only (a whitelist: no
    weights, no weight hash, no noise)."""
    card = bundle.public_card()
    # every release is a box of d >= 1 public intervals, one beta per coordinate
    ivs = tuple((iv.lo, iv.hi) for iv in bundle.box.intervals)
    betas = bundle.betas
    lo, hi = ivs[0]
    beta = betas[0]
    return t.Release(
        release_id=str(card["bundle_id"]),
        mode=str(card.get("mode") or ""),
        epsilon=_f(card.get("epsilon")),
        delta=_f(card.get("delta")),
        delta_total=_f(card.get("delta_total")),
        holds=bool(card.get("holds")),
        basis=str(card.get("basis") or ""),
        reason=card.get("reason") or None,
        sigma=_f(card.get("sigma")),
        beta=beta,
        interval=(float(lo), float(hi)),
        n_actions=int(card["actions"]),
        created_at=_when(card.get("created_at")),
        status=_status(record),
        seeded=bool(card.get("seeded")),
        env_id=str(card.get("env_id") or ""),
        q_bound=None if card.get("q_bound") is None else float(card["q_bound"]),
        value_grid=value_grid,
        card=card,
        dims=len(ivs),
        state_intervals=ivs,
        betas=betas,
    )


def release_from_record(record: ReleaseRecord, *, value_grid: float) -> t.Release:
    """A release known only from the store (its bundle is not on this server): the store's
    parameters, privacy fields unknown (NaN / empty)."""
    lo, hi = record.interval
    return t.Release(
        release_id=str(record.release_id),
        mode="",
        epsilon=math.nan,
        delta=math.nan,
        delta_total=math.nan,
        holds=False,
        basis="",
        reason="bundle not available on this server",
        sigma=float(record.sigma),
        beta=float(record.beta),
        interval=(float(lo), float(hi)),
        n_actions=int(record.n_actions),
        created_at=_when(getattr(record, "created_at", None)),
        status=_status(record),
        seeded=False,
        env_id="",
        q_bound=None,
        value_grid=value_grid,
        card={},
        dims=int(getattr(record, "dims", 1)),
        state_intervals=((float(lo), float(hi)),) if getattr(record, "dims", 1) == 1 else (),
        betas=tuple(getattr(record, "betas", ()) or (float(record.beta),)),
    )


def noise_point(p: StoredPoint, *, lo: float, hi: float) -> t.NoisePoint:
    x = float(p.x)
    return t.NoisePoint(
        seq=int(p.seq),
        x=x,
        state=lo + x * (hi - lo),
        g=float(p.g),
        created_at=_when(getattr(p, "created_at", None)),
        hash=str(getattr(p, "hash", "") or ""),
    )


def _jsonable(obj: object) -> JSONValue:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, float | int | str | bool) or obj is None:
        return obj
    return str(obj)


def integrity_from_report(release_id: str, report: IntegrityReport) -> t.IntegrityResult:
    """The store's IntegrityReport (qveil.server.store.integrity) as the API type; gap
    ranges are expanded to at most the first 100 missing sequence numbers; the whole report
    also goes out as JSON."""
    actions: list[t.ActionIntegrity] = []
    for a in report.actions:
        gaps = list(
            itertools.islice((s for lo, hi in a.gaps for s in range(int(lo), int(hi) + 1)), 100)
        )
        actions.append(
            t.ActionIntegrity(
                action=int(a.action),
                ok=bool(a.ok),
                count=int(a.count),
                high_water_mark=int(a.high_water),
                first_broken_seq=None if a.first_broken is None else int(a.first_broken),
                gaps=tuple(gaps),
                message="; ".join(map(str, a.problems)),
            )
        )
    full = report.to_dict() if hasattr(report, "to_dict") else _jsonable(report)
    return t.IntegrityResult(
        release_id=release_id, ok=bool(report.ok), actions=tuple(actions), report=_jsonable(full)
    )
