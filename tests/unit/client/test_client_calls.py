"""The ValueService calls apart from their transport (qveil.client.calls): the request fields
of states of one or d coordinates, each call's request and stub method, and the decoding of
its answer."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.client import calls
from qveil.common import serde
from qveil.common import typing as t
from qveil.v1 import value_service_pb2 as value_pb


def test_as_states_and_is_flat() -> None:
    assert calls.as_states(0.5) == [0.5]
    assert calls.as_states([[1, 2], [3, 4]]) == [1.0, 2.0, 3.0, 4.0]
    assert calls.is_flat([0.1, 0.2]) and not calls.is_flat([0.1])
    assert not calls.is_flat(0.3) and not calls.is_flat([[0.1, 0.2]])


@pytest.mark.parametrize(
    ("states", "dims", "flat"),
    [
        (0.3, 1, [0.3]),
        ([0.1, 0.2, 0.3], 1, [0.1, 0.2, 0.3]),  # n states of a 1-D release
        ([[0.1], [0.2]], 1, [0.1, 0.2]),  # [n, 1]
        ([0.1, 0.2, 0.3], 4, [0.1, 0.2, 0.3]),  # not d numbers: a 1-D list
    ],
)
def test_one_coordinate_goes_as_the_states_list(
    states: object, dims: int, flat: list[float]
) -> None:
    assert calls.state_fields(states, dims) == {"states": flat}  # type: ignore[arg-type]


def test_d_coordinates_go_as_a_state_matrix() -> None:
    m = calls.state_fields(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))["state_matrix"]
    assert (list(m.values), m.dims) == ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2)
    one = calls.state_fields([0.1, 0.2, 0.3], 3)["state_matrix"]  # a flat list of d numbers
    assert (list(one.values), one.dims) == ([0.1, 0.2, 0.3], 3)


def test_get_values_request_and_decoding() -> None:
    call = calls.get_values({"states": [0.1, 0.2]}, [2, 0], "rel-1")
    assert call.method == "GetValues"
    assert isinstance(call.request, value_pb.GetValuesRequest)
    assert list(call.request.states) == [0.1, 0.2] and list(call.request.actions) == [2, 0]
    assert call.request.release_id == "rel-1"
    assert list(calls.get_values({"states": [0.1]}, None, "").request.actions) == []
    want = t.Values("rel-1", (2, 0), np.array([[1.0, 2.0], [3.0, 4.0]]), 0.5)
    decoded = call.decode(serde.values_to_proto(want))
    assert decoded.release_id == "rel-1" and decoded.actions == (2, 0)
    np.testing.assert_array_equal(decoded.values, want.values)


def test_get_best_actions_and_get_release() -> None:
    call = calls.get_best_actions({"states": [0.4]}, "")
    assert call.method == "GetBestActions"
    assert isinstance(call.request, value_pb.GetBestActionsRequest)
    assert list(call.request.states) == [0.4]
    release = calls.get_release()
    assert release.method == "GetRelease"
    assert isinstance(release.request, value_pb.GetReleaseRequest)
