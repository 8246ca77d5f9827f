"""The grpc.aio servicers of ValueService, AdminService and AuditService
(qveil.server.protocol.grpc.servicer) through a real in-process server with tokens, called with
the generated stubs: each request reaches the data plane and its answer comes back as the
protobuf the SDK reads; errors come back with the one table's code, reason and field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2
from server_helpers import Served, served_values

from qveil.common.errors import DETAILS_KEY
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import release_pb2 as release_pb
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc


@pytest.fixture(scope="module")
def channel(served: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.server.target) as ch:
        yield ch


def _reason(exc: grpc.RpcError) -> str:
    md = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    status = status_pb2.Status.FromString(md[DETAILS_KEY])
    for d in status.details:
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info):
            return str(info.reason)
    return ""


def test_value_service(served: Served, channel: grpc.Channel) -> None:
    stub = value_grpc.ValueServiceStub(channel)
    md = served.md("query")
    xs = [-1.0, 0.25, 1.5]
    want = served_values(served.bundle, xs)
    r = stub.GetValues(value_pb.GetValuesRequest(states=xs, actions=[2, 0]), metadata=md)
    assert list(r.actions) == [2, 0]
    assert np.array(r.values).tobytes() == want[:, [2, 0]].reshape(-1).tobytes()
    m = value_pb.StateMatrix(dims=1, values=xs)
    r2 = stub.GetValues(value_pb.GetValuesRequest(state_matrix=m), metadata=md)
    assert np.array(r2.values).tobytes() == want.reshape(-1).tobytes()
    best = stub.GetBestActions(value_pb.GetBestActionsRequest(states=xs), metadata=md)
    assert list(best.actions) == want.argmax(1).tolist()
    rel = stub.GetRelease(value_pb.GetReleaseRequest(), metadata=md).release
    card = json.loads(rel.card_json)
    assert rel.release_id == card["bundle_id"] and "weights_sha256" not in card


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (
            value_pb.GetValuesRequest(states=[0.1], state_matrix=value_pb.StateMatrix(dims=1)),
            "give states or state_matrix, not both",
        ),
        (
            value_pb.GetValuesRequest(state_matrix=value_pb.StateMatrix(dims=2, values=[1.0])),
            "state_matrix has 1 values, not a multiple of dims = 2",
        ),
        (
            value_pb.GetValuesRequest(state_matrix=value_pb.StateMatrix(dims=0, values=[1.0])),
            "not a multiple of dims = 0",
        ),
    ],
)
def test_a_malformed_state_matrix_is_invalid_and_answers_nothing(
    served: Served, channel: grpc.Channel, request_: value_pb.GetValuesRequest, says: str
) -> None:
    before = served.server.services.ctx.metrics.states_answered
    with pytest.raises(grpc.RpcError) as ei:
        value_grpc.ValueServiceStub(channel).GetValues(request_, metadata=served.md("query"))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert says in ei.value.details()  # type: ignore[attr-defined]
    assert _reason(ei.value) == "WRONG_DIMS"
    assert served.server.services.ctx.metrics.states_answered == before


def test_admin_service(served: Served, channel: grpc.Channel) -> None:
    stub = admin_grpc.AdminServiceStub(channel)
    md = served.md("admin")
    listed = stub.ListReleases(admin_pb.ListReleasesRequest(), metadata=md)
    rid = listed.active_release_id
    assert [r.release_id for r in listed.releases] == [rid]
    assert release_pb.ReleaseStatus.Name(listed.releases[0].status) == "RELEASE_STATUS_ACTIVE"
    stats = stub.GetStats(admin_pb.GetStatsRequest(), metadata=md)
    assert stats.active_release_id == rid and stats.max_batch == 64
    budget = stub.GetBudget(admin_pb.GetBudgetRequest(), metadata=md)
    assert rid in budget.report_json and budget.budgets[0].event_count >= 1
    card = stub.GetAdminCard(admin_pb.GetAdminCardRequest(), metadata=md)
    assert card.release_id == rid and "weights_sha256" in json.loads(card.admin_card_json)
    assert "weights_sha256" not in json.loads(card.card_json)
    for call, req, code, says in (
        (stub.ActivateRelease, admin_pb.ActivateReleaseRequest(), "INVALID_ARGUMENT", "give"),
        (
            stub.RetireRelease,
            admin_pb.RetireReleaseRequest(release_id=rid),
            "FAILED_PRECONDITION",
            "is active",
        ),
        (stub.GetAdminCard, admin_pb.GetAdminCardRequest(release_id="no"), "NOT_FOUND", "no"),
    ):
        with pytest.raises(grpc.RpcError) as ei:
            call(req, metadata=md)
        assert ei.value.code().name == code and says in ei.value.details()  # type: ignore[attr-defined]
    assert stub.GetStats(admin_pb.GetStatsRequest(), metadata=md).active_release_id == rid


@pytest.mark.parametrize("role", [None, "query", "auditor"])
def test_admin_needs_the_admin_role(
    served: Served, channel: grpc.Channel, role: str | None
) -> None:
    md = served.md(role) if role else []
    with pytest.raises(grpc.RpcError) as ei:
        admin_grpc.AdminServiceStub(channel).GetStats(admin_pb.GetStatsRequest(), metadata=md)
    want = grpc.StatusCode.UNAUTHENTICATED if role is None else grpc.StatusCode.PERMISSION_DENIED
    assert ei.value.code() == want  # type: ignore[attr-defined]


def test_audit_service(served: Served, channel: grpc.Channel) -> None:
    md_q, md = served.md("query"), served.md("auditor")
    xs = [0.0, 0.5, 1.0]
    value_grpc.ValueServiceStub(channel).GetValues(
        value_pb.GetValuesRequest(states=xs), metadata=md_q
    )
    assert served.server.answers.flush(30)
    stub = audit_grpc.AuditServiceStub(channel)
    msgs = list(stub.StreamNoisePoints(audit_pb.StreamNoisePointsRequest(action=1), metadata=md))
    points = [p for m in msgs for p in m.points]
    assert {m.action for m in msgs} == {1}
    # (the module's server logged other states before): each state asked is there, on the grid
    assert all(min(abs(p.state - x) for p in points) < 1e-6 for x in xs)
    assert len({p.x for p in points}) == len(points)  # each state logged once
    assert [p.seq for p in points] == sorted(p.seq for p in points)
    whole = stub.VerifyIntegrity(audit_pb.VerifyIntegrityRequest(), metadata=md)
    assert whole.ok and [a.action for a in whole.actions] == [0, 1, 2]
    one = stub.VerifyIntegrity(audit_pb.VerifyIntegrityRequest(action=2), metadata=md)
    assert [a.action for a in one.actions] == [2]
    with pytest.raises(grpc.RpcError) as ei:
        list(stub.StreamNoisePoints(audit_pb.StreamNoisePointsRequest(action=9), metadata=md))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert _reason(ei.value) == "UNKNOWN_ACTION"
    with pytest.raises(grpc.RpcError) as ei:
        stub.VerifyIntegrity(audit_pb.VerifyIntegrityRequest(release_id="nope"), metadata=md)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
