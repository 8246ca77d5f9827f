"""Protobuf <-> the API's dataclasses (``qveil.common.typing``), in pairs ``*_to_proto`` /
``*_from_proto`` (round-trip tested in tests/unit/common/test_common_serde.py). The server
builds its messages and the SDK reads them through these, so both sides agree on one mapping."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
from google.protobuf import timestamp_pb2

from qveil.common import typing as t
from qveil.json_types import JSONObject
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import release_pb2
from qveil.v1 import value_service_pb2 as value_pb

STATUS_TO_PROTO = {
    "staged": release_pb2.RELEASE_STATUS_STAGED,
    "active": release_pb2.RELEASE_STATUS_ACTIVE,
    "retired": release_pb2.RELEASE_STATUS_RETIRED,
    "": release_pb2.RELEASE_STATUS_UNSPECIFIED,
}
STATUS_FROM_PROTO = {v: k for k, v in STATUS_TO_PROTO.items()}


def timestamp_to_proto(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
    return ts


def timestamp_from_proto(ts: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime(tzinfo=UTC) if present else None


def release_to_proto(r: t.Release) -> release_pb2.Release:
    msg = release_pb2.Release(
        release_id=r.release_id,
        mode=r.mode,
        epsilon=r.epsilon,
        delta=r.delta,
        delta_total=r.delta_total,
        holds=r.holds,
        basis=r.basis,
        reason=r.reason or "",
        sigma=r.sigma,
        beta=r.beta,
        state_low=r.interval[0],
        state_high=r.interval[1],
        action_count=r.n_actions,
        status=STATUS_TO_PROTO[r.status],
        seeded=r.seeded,
        env_id=r.env_id,
        value_grid=r.value_grid,
        card_json=json.dumps(r.card, sort_keys=True, default=str),
        dims=r.dims,
        state_intervals=[
            release_pb2.StateInterval(low=lo, high=hi) for lo, hi in r.state_intervals
        ],
        betas=list(r.betas),
    )
    ts = timestamp_to_proto(r.created_at)
    if ts is not None:
        msg.create_time.CopyFrom(ts)
    if r.q_bound is not None:
        msg.q_bound = r.q_bound
    return msg


def release_from_proto(msg: release_pb2.Release) -> t.Release:
    return t.Release(
        release_id=msg.release_id,
        mode=msg.mode,
        epsilon=msg.epsilon,
        delta=msg.delta,
        delta_total=msg.delta_total,
        holds=msg.holds,
        basis=msg.basis,
        reason=msg.reason or None,
        sigma=msg.sigma,
        beta=msg.beta,
        interval=(msg.state_low, msg.state_high),
        n_actions=msg.action_count,
        created_at=timestamp_from_proto(msg.create_time, msg.HasField("create_time")),
        status=STATUS_FROM_PROTO.get(msg.status, ""),
        seeded=msg.seeded,
        env_id=msg.env_id,
        q_bound=msg.q_bound if msg.HasField("q_bound") else None,
        value_grid=msg.value_grid,
        card=json.loads(msg.card_json) if msg.card_json else {},
        dims=msg.dims or 1,
        state_intervals=tuple((iv.low, iv.high) for iv in msg.state_intervals),
        betas=tuple(msg.betas),
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def packed_doubles(field_number: int, values: npt.ArrayLike) -> bytes:
    """The wire bytes of a packed ``repeated double`` field holding ``values`` (row-major,
    little-endian IEEE 754, every bit kept: -0.0 stays -0.0), to merge into a message with
    ``MergeFromString``; empty for no values, as protobuf writes an empty packed field. One
    numpy copy instead of a Python float per value."""
    data = np.ascontiguousarray(values, dtype="<f8").tobytes()
    if not data:
        return b""
    return _varint(field_number << 3 | 2) + _varint(len(data)) + data


def packed_varints(field_number: int, values: npt.ArrayLike) -> bytes:
    """The wire bytes of a packed ``repeated int64`` / ``int32`` field holding ``values``
    (varints; a negative value sign-extended to 10 bytes, as protobuf writes it), to merge
    into a message with ``MergeFromString``; empty for no values. Built with numpy, one
    7-bit group of every value at a time, instead of a Python int per value."""
    v = np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
    if v.size == 0:
        return b""
    if int(v.max()) < 0x80:  # the usual case (action indices): one byte each
        data = v.astype(np.uint8).tobytes()
    else:
        size = np.ones(v.size, dtype=np.int64)  # bytes per value
        for k in range(1, 10):
            size += v >= np.uint64(1 << (7 * k))
        start = np.cumsum(size) - size
        out = np.empty(int(size.sum()), dtype=np.uint8)
        for k in range(int(size.max())):
            m = size > k
            group = (v[m] >> np.uint64(7 * k)) & np.uint64(0x7F)
            more = np.where(size[m] > k + 1, 0x80, 0).astype(np.uint64)
            out[start[m] + k] = (group | more).astype(np.uint8)
        data = out.tobytes()
    return _varint(field_number << 3 | 2) + _varint(len(data)) + data


_VALUES_FIELD = value_pb.GetValuesResponse.DESCRIPTOR.fields_by_name["values"].number
_BEST_FIELDS = value_pb.GetBestActionsResponse.DESCRIPTOR.fields_by_name


def values_to_proto(v: t.Values) -> value_pb.GetValuesResponse:
    msg = value_pb.GetValuesResponse(
        release_id=v.release_id, actions=list(v.actions), value_grid=v.value_grid
    )
    msg.MergeFromString(packed_doubles(_VALUES_FIELD, v.values))
    return msg


def values_from_proto(msg: value_pb.GetValuesResponse) -> t.Values:
    actions = tuple(msg.actions)
    vals = np.asarray(msg.values, dtype=np.float64)
    width = max(len(actions), 1)
    return t.Values(
        release_id=msg.release_id,
        actions=actions,
        values=vals.reshape(len(vals) // width, width),
        value_grid=msg.value_grid,
    )


def best_actions_to_proto(b: t.BestActions) -> value_pb.GetBestActionsResponse:
    msg = value_pb.GetBestActionsResponse(release_id=b.release_id, value_grid=b.value_grid)
    msg.MergeFromString(
        packed_varints(_BEST_FIELDS["actions"].number, b.actions)
        + packed_doubles(_BEST_FIELDS["values"].number, b.values)
    )
    return msg


def best_actions_from_proto(msg: value_pb.GetBestActionsResponse) -> t.BestActions:
    return t.BestActions(
        release_id=msg.release_id,
        actions=np.asarray(msg.actions, dtype=np.int64),
        values=np.asarray(msg.values, dtype=np.float64),
        value_grid=msg.value_grid,
    )


def noise_point_to_proto(p: t.NoisePoint) -> audit_pb.NoisePoint:
    msg = audit_pb.NoisePoint(seq=p.seq, x=p.x, state=p.state, g=p.g, hash=p.hash)
    ts = timestamp_to_proto(p.created_at)
    if ts is not None:
        msg.create_time.CopyFrom(ts)
    return msg


def noise_point_from_proto(msg: audit_pb.NoisePoint) -> t.NoisePoint:
    return t.NoisePoint(
        seq=msg.seq,
        x=msg.x,
        state=msg.state,
        g=msg.g,
        created_at=timestamp_from_proto(msg.create_time, msg.HasField("create_time")),
        hash=msg.hash,
    )


def integrity_to_proto(r: t.IntegrityResult) -> audit_pb.VerifyIntegrityResponse:
    return audit_pb.VerifyIntegrityResponse(
        release_id=r.release_id,
        ok=r.ok,
        report_json=json.dumps(r.report, default=str),
        actions=[
            audit_pb.ActionIntegrity(
                action=a.action,
                ok=a.ok,
                count=a.count,
                high_water_mark=a.high_water_mark,
                first_broken_seq=-1 if a.first_broken_seq is None else a.first_broken_seq,
                gaps=list(a.gaps),
                message=a.message,
            )
            for a in r.actions
        ],
    )


def integrity_from_proto(msg: audit_pb.VerifyIntegrityResponse) -> t.IntegrityResult:
    return t.IntegrityResult(
        release_id=msg.release_id,
        ok=msg.ok,
        report=json.loads(msg.report_json) if msg.report_json else {},
        actions=tuple(
            t.ActionIntegrity(
                action=a.action,
                ok=a.ok,
                count=a.count,
                high_water_mark=a.high_water_mark,
                first_broken_seq=None if a.first_broken_seq < 0 else a.first_broken_seq,
                gaps=tuple(a.gaps),
                message=a.message,
            )
            for a in msg.actions
        ),
    )


def _finite_or_nan(v: float) -> float:
    return v if math.isfinite(v) else float("nan")


def report_to_proto(r: t.StatisticalReport) -> audit_pb.GetStatisticalReportResponse:
    return audit_pb.GetStatisticalReportResponse(
        release_id=r.release_id,
        passed=r.passed,
        report_json=json.dumps(r.report, default=str),
        actions=[
            audit_pb.ActionNormality(
                action=a.action,
                n=a.n,
                ks_p=a.ks_p,
                chi2_p=a.chi2_p,
                mean=a.mean,
                var=a.var,
                passed=a.passed,
            )
            for a in r.actions
        ],
    )


def report_from_proto(msg: audit_pb.GetStatisticalReportResponse) -> t.StatisticalReport:
    return t.StatisticalReport(
        release_id=msg.release_id,
        passed=msg.passed,
        report=json.loads(msg.report_json) if msg.report_json else {},
        actions=tuple(
            t.ActionNormality(
                action=a.action,
                n=a.n,
                ks_p=_finite_or_nan(a.ks_p),
                chi2_p=_finite_or_nan(a.chi2_p),
                mean=a.mean,
                var=a.var,
                passed=a.passed,
            )
            for a in msg.actions
        ),
    )


def stats_to_proto(s: t.ServerStats) -> admin_pb.GetStatsResponse:
    return admin_pb.GetStatsResponse(
        active_release_id=s.active_release_id,
        uptime_seconds=s.uptime_seconds,
        requests_by_code=dict(s.requests_by_code),
        states_answered=s.states_answered,
        new_points=s.new_points,
        in_flight=s.in_flight,
        max_in_flight=s.max_in_flight,
        stored_points=[
            admin_pb.ActionPointCount(action=a, count=c) for a, c in sorted(s.stored_points.items())
        ],
        max_batch=s.max_batch,
    )


def budget_to_proto(reports: list[JSONObject]) -> admin_pb.GetBudgetResponse:
    """Ledger budget reports (``BudgetReport.to_dict()``) as GetBudgetResponse."""
    out = []
    for d in reports:
        cap, rem = d.get("cap"), d.get("remaining")
        b = admin_pb.DatasetBudget(
            dataset_id=d["dataset_id"],
            spent_epsilon=float(d["spent"]["epsilon"]),
            spent_delta=float(d["spent"]["delta"]),
            event_count=len(d.get("events", ())),
        )
        if cap is not None:
            b.cap_epsilon, b.cap_delta = float(cap["epsilon"]), float(cap["delta"])
        if rem is not None:
            b.remaining_epsilon, b.remaining_delta = float(rem["epsilon"]), float(rem["delta"])
        out.append(b)
    return admin_pb.GetBudgetResponse(
        budgets=out, report_json=json.dumps(reports, sort_keys=True, default=str)
    )


def budget_from_proto(msg: admin_pb.GetBudgetResponse) -> list[JSONObject]:
    """The full reports (every event) as ``qveil admin budget --json`` prints them."""
    reports: list[JSONObject] = json.loads(msg.report_json or "[]")
    return reports


def stats_from_proto(msg: admin_pb.GetStatsResponse) -> t.ServerStats:
    return t.ServerStats(
        active_release_id=msg.active_release_id,
        uptime_seconds=msg.uptime_seconds,
        requests_by_code=dict(msg.requests_by_code),
        states_answered=msg.states_answered,
        new_points=msg.new_points,
        in_flight=msg.in_flight,
        max_in_flight=msg.max_in_flight,
        stored_points={p.action: p.count for p in msg.stored_points},
        max_batch=msg.max_batch,
    )
