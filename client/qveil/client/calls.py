"""The ValueService calls of the SDK apart from their transport: the request fields of some
states, and for each call the request it sends, the stub method that sends it and how its
answer is decoded. :class:`qveil.client.ValueClient` runs a :class:`Call` blocking and
:class:`qveil.client.AsyncValueClient` awaits it, so both send the same messages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from qveil.common import serde as convert
from qveil.common import typing as t
from qveil.v1 import value_service_pb2 as value_pb

__all__ = [
    "Call",
    "as_states",
    "get_best_actions",
    "get_release",
    "get_values",
    "is_flat",
    "state_fields",
]

#: The response message of a call's stub method.
M = TypeVar("M", bound=Message)
#: What the SDK makes of it.
T = TypeVar("T")


def as_states(states: npt.ArrayLike) -> list[float]:
    """States as a flat list of floats (a scalar is one state)."""
    arr = np.asarray(states, dtype=np.float64)
    return [float(v) for v in arr.reshape(-1)]


def is_flat(states: npt.ArrayLike) -> bool:
    """True when ``states`` is a flat list of more than one number: n states of a 1-D
    release, or one state of a release of that many coordinates (the release's dims says)."""
    return bool(np.ndim(states) == 1 and np.size(states) > 1)


class StateFields(TypedDict, total=False):
    """The state fields of a GetValues / GetBestActions request: one of the two."""

    states: list[float]
    state_matrix: value_pb.StateMatrix


def state_fields(states: npt.ArrayLike, dims: int = 1) -> StateFields:
    """The request fields of ``states`` for a release of ``dims`` coordinates: an array of
    shape [n, d] with d > 1 goes as a ``state_matrix`` (n states of d coordinates,
    row-major), and so does a flat list of exactly ``dims`` > 1 numbers (one state);
    anything else (a scalar, a list, [n] or [n, 1]) as the 1-D ``states`` list."""
    arr = np.asarray(states, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == dims:
        arr = arr.reshape(1, dims)
    if arr.ndim == 2 and arr.shape[1] > 1:
        return {
            "state_matrix": value_pb.StateMatrix(
                values=arr.reshape(-1).tolist(), dims=int(arr.shape[1])
            )
        }
    return {"states": as_states(arr)}


@dataclass(frozen=True, slots=True)
class Call(Generic[M, T]):
    """One ValueService call: ``method`` (the stub's attribute), ``request``, and ``decode``
    (the response message ``M`` of ``method`` to the SDK's type ``T``)."""

    method: str
    request: Message
    decode: Callable[[M], T]


def get_values(
    fields: StateFields, actions: Sequence[int] | None, release_id: str
) -> Call[value_pb.GetValuesResponse, t.Values]:
    """GetValues of the states in ``fields`` (:func:`state_fields`), all actions when
    ``actions`` is None or empty."""
    request = value_pb.GetValuesRequest(
        **fields, actions=list(actions or ()), release_id=release_id
    )
    return Call("GetValues", request, convert.values_from_proto)


def get_best_actions(
    fields: StateFields, release_id: str
) -> Call[value_pb.GetBestActionsResponse, t.BestActions]:
    request = value_pb.GetBestActionsRequest(**fields, release_id=release_id)
    return Call("GetBestActions", request, convert.best_actions_from_proto)


def _release(resp: value_pb.GetReleaseResponse) -> t.Release:
    return convert.release_from_proto(resp.release)


def get_release() -> Call[value_pb.GetReleaseResponse, t.Release]:
    """GetRelease: the public card of the active release."""
    return Call("GetRelease", value_pb.GetReleaseRequest(), _release)
