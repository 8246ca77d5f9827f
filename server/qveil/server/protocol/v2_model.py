"""The model ``qveil`` of the Open Inference Protocol (KServe v2), transport-independent.

Both v2 bindings (gRPC: ``qveil.server.protocol.grpc.v2_servicer``; REST/JSON:
``qveil.server.protocol.rest.v2_endpoints``) decode their request into :class:`InferRequest`
and call the data plane's ``infer``, which calls :meth:`OIPModel.infer` on the ONE query
service that ValueService uses (``QueryService.get_values``, ``get_best_actions``,
``get_action_values``): the same validation, the same keyed noise, the same value grid, the
same limits. Nothing here touches the store.

The model::

    input  STATE        FP64  [n, d]   d = the release's state coordinates
    input  ACTION       INT64 [n]      optional: one action per state
    output Q            FP64  [n, m]   all actions; [n] (Q[i, ACTION[i]]) when ACTION is given
    output BEST_ACTION  INT64 [n]      argmax of the released values (ties: lowest action)

Outputs by default: Q and BEST_ACTION without ACTION; Q alone with ACTION (BEST_ACTION needs
every action's value at every state, which would compute (and log) noise the caller did not
ask for; it is computed when asked for by name). The model's version is the active release
id; a request naming another version is refused exactly like a pinned ``release_id`` of
GetValues.

Every decoding error is an ``InvalidArgument`` raised before a handler runs, so a rejected
request is neither answered nor logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from qveil.errors import NotFound, Unavailable, bad_argument, clip, echo
from qveil.server.serving.query import QueryService
from qveil.server.serving.state import ActiveRelease

__all__ = [
    "MODEL_NAME",
    "PLATFORM",
    "InferRequest",
    "InferResponse",
    "ModelMetadata",
    "OIPModel",
    "ServerMetadata",
    "Tensor",
    "decode_raw",
]

MODEL_NAME = "qveil"
PLATFORM = "qveil_value_release"
SERVER_NAME = "qveil"
STATE, ACTION, Q, BEST_ACTION = "STATE", "ACTION", "Q", "BEST_ACTION"
OUTPUTS = (Q, BEST_ACTION)
#: public card fields copied into ModelMetadata's ``properties`` (when the card has them)
CARD_PROPERTIES = ("env_id", "created_at", "mode", "epsilon", "delta")
#: v2 datatype -> little-endian numpy dtype (what this model reads; FP32 states, which most
#: clients send, are widened to FP64 exactly)
#: what a tensor holds: FP64, FP32 or INT64 values
Scalar = np.float64 | np.float32 | np.int64
DTYPES: dict[str, np.dtype[Scalar]] = {
    "FP64": np.dtype("<f8"),
    "FP32": np.dtype("<f4"),
    "INT64": np.dtype("<i8"),
}


@dataclass(frozen=True)
class Tensor:
    """One decoded tensor: name, v2 datatype, shape and its data (flat, row-major)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Scalar]


@dataclass(frozen=True)
class InferRequest:
    inputs: Sequence[Tensor]
    model_name: str = MODEL_NAME
    model_version: str = ""
    id: str = ""
    outputs: Sequence[str] = field(default_factory=tuple)  # empty: the default outputs


@dataclass(frozen=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: tuple[Tensor, ...]


class TensorMetadata(TypedDict):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(TypedDict):
    """v2 ModelMetadata (REST: its JSON body; gRPC: ModelMetadataResponse's fields)."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    properties: dict[str, str]


class ServerMetadata(TypedDict):
    """v2 ServerMetadata (REST: its JSON body; gRPC: ServerMetadataResponse's fields)."""

    name: str
    version: str
    extensions: list[str]


def decode_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """A tensor from raw little-endian bytes (``raw_input_contents``; Triton's binary data)."""
    dt = DTYPES.get(datatype)
    if dt is None:
        raise bad_argument(
            f"input {echo(name)} has datatype {echo(datatype)}; expected {_expected_dtype(name)}",
            field=f"inputs[{clip(name)}].datatype",
            reason="WRONG_DATATYPE",
        )
    if len(raw) % dt.itemsize:
        raise bad_argument(
            f"raw contents of input {echo(name)} are {len(raw)} bytes, not a multiple of "
            f"{dt.itemsize} ({datatype})",
            field=f"inputs[{clip(name)}]",
            reason="WRONG_SHAPE",
        )
    data = np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))
    return Tensor(name, datatype, tuple(int(s) for s in shape), data)


def _expected_dtype(name: str) -> str:
    return {STATE: "FP64", ACTION: "INT64"}.get(name, "FP64 (STATE) or INT64 (ACTION)")


def _widened(t: Tensor) -> Tensor:
    """An FP32 STATE as FP64 (exact: every float32 is a float64); other tensors as given."""
    if t.name == STATE and t.datatype == "FP32":
        return Tensor(t.name, "FP64", t.shape, t.data.astype(np.float64))
    return t


def _n_elements(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


class OIPModel:
    """The v2 view of one server's query service."""

    def __init__(self, query: QueryService) -> None:
        self.h = query

    # ------------------------------------------------------------------ metadata
    def version(self) -> str:
        """The active release id ('' while none is loaded)."""
        rel = self.h.holder.peek()
        return rel.release_id if rel is not None else ""

    def ready(self, name: str, version: str = "") -> bool:
        rel = self.h.holder.peek()
        return (
            name == MODEL_NAME
            and rel is not None
            and not self.h.holder.draining
            and version in ("", rel.release_id)
        )

    def check_model(self, name: str, version: str = "") -> None:
        if name != MODEL_NAME:
            raise NotFound(
                f"unknown model {echo(name)}: this server serves one model, {MODEL_NAME!r}"
            )
        if version:
            self.h.holder.current()  # Unavailable while starting
            if version != self.version():
                # the same answer as a GetValues pinned to this release id
                self.h._release_for_query(version)

    def properties(self, rel: ActiveRelease) -> dict[str, str]:
        """ModelMetadata's ``properties`` (strings): the release id, the value grid, how the
        noise is evaluated and a few fields of the release's PUBLIC card (its allow-list: no
        weights, hash, key or noise; the privacy numbers are the accountant's, as the card
        states them). The whole public card is ReleaseService.GetRelease's ``card_json``."""
        card = rel.bundle.public_card()
        props = {"release_id": rel.release_id, "value_grid": repr(self.h.limits.value_grid)}
        noise = card.get("noise_path")
        if isinstance(noise, dict) and isinstance(noise.get("construction"), str):
            props["noise_path"] = noise["construction"]
        for key in CARD_PROPERTIES:
            value = card.get(key)
            if value is not None and not isinstance(value, (dict, list)):
                props[key] = value if isinstance(value, str) else json.dumps(value)
        return props

    def metadata(self, name: str = MODEL_NAME, version: str = "") -> ModelMetadata:
        """ModelMetadata: name, versions (the active release), platform, inputs, outputs and
        :meth:`properties`."""
        self.check_model(name, version)
        rel = self.h.holder.current()
        m = int(rel.bundle.n_actions)
        d = int(rel.bundle.dims)  # d > 1: a release of d state coordinates
        return {
            "name": MODEL_NAME,
            "versions": [rel.release_id],
            "platform": PLATFORM,
            "inputs": [
                {"name": STATE, "datatype": "FP64", "shape": [-1, d]},  # FP32 accepted
                {"name": ACTION, "datatype": "INT64", "shape": [-1]},
            ],
            "outputs": [
                {"name": Q, "datatype": "FP64", "shape": [-1, m]},
                {"name": BEST_ACTION, "datatype": "INT64", "shape": [-1]},
            ],
            "properties": self.properties(rel),
        }

    # ------------------------------------------------------------------ inference
    def _parse(
        self, req: InferRequest
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64] | None, list[str]]:
        self.check_model(req.model_name, "")
        by_name: dict[str, Tensor] = {}
        for t in req.inputs:
            if t.name not in (STATE, ACTION):
                raise bad_argument(
                    f"unknown input {echo(t.name)}: model {MODEL_NAME!r} takes STATE "
                    "(FP64 [n, d]) and optionally ACTION (INT64 [n])",
                    field=f"inputs[{clip(t.name)}]",
                    reason="UNKNOWN_INPUT",
                )
            if t.name in by_name:
                raise bad_argument(
                    f"input {t.name} is given twice", field=f"inputs[{t.name}]", reason="DUPLICATE"
                )
            by_name[t.name] = t
        by_name = {k: _widened(t) for k, t in by_name.items()}
        for t in by_name.values():
            want = _expected_dtype(t.name)
            if t.datatype != want:
                raise bad_argument(
                    f"input {t.name} has datatype {echo(t.datatype)}; expected {want}"
                    + (" or FP32" if t.name == STATE else ""),
                    field=f"inputs[{t.name}].datatype",
                    reason="WRONG_DATATYPE",
                )
            if any(s < 0 for s in t.shape) or t.data.size != _n_elements(t.shape):
                raise bad_argument(
                    f"input {t.name} has shape {list(t.shape)[:8]} but {t.data.size} elements",
                    field=f"inputs[{t.name}].shape",
                    reason="WRONG_SHAPE",
                )
        if STATE not in by_name:
            raise bad_argument(
                "input STATE (FP64 [n, d]) is required", field="inputs", reason="MISSING_INPUT"
            )
        st = by_name[STATE]
        if len(st.shape) != 2:
            raise bad_argument(
                f"input STATE must have shape [n, d], got {list(st.shape)[:8]}",
                field="inputs[STATE].shape",
                reason="WRONG_SHAPE",
            )
        d = int(self.h.holder.current().bundle.dims)  # the handlers check it again
        if st.shape[1] != d:
            raise bad_argument(
                f"input STATE has d = {st.shape[1]}; this release takes states of d = {d} "
                f"(shape [n, {d}])",
                field="inputs[STATE].shape",
                reason="WRONG_SHAPE",
            )
        states: npt.NDArray[np.float64] = np.asarray(st.data, dtype=np.float64).reshape(-1)
        if d > 1:
            states = states.reshape(-1, d)
        actions: npt.NDArray[np.int64] | None = None
        if ACTION in by_name:
            at = by_name[ACTION]
            if len(at.shape) != 1 or at.shape[0] != st.shape[0]:
                raise bad_argument(
                    f"input ACTION must have shape [n] = [{st.shape[0]}] (one action per "
                    f"state), got {list(at.shape)[:8]}",
                    field="inputs[ACTION].shape",
                    reason="WRONG_SHAPE",
                )
            actions = np.asarray(at.data, dtype=np.int64).reshape(-1)
        wanted = list(req.outputs)
        for name in wanted:
            if name not in OUTPUTS:
                raise bad_argument(
                    f"unknown output {echo(name)}: model {MODEL_NAME!r} has outputs Q and "
                    "BEST_ACTION",
                    field=f"outputs[{clip(name)}]",
                    reason="UNKNOWN_OUTPUT",
                )
        if not wanted:
            wanted = [Q] if actions is not None else [Q, BEST_ACTION]
        return states, actions, list(dict.fromkeys(wanted))

    def infer(
        self, req: InferRequest, *, deadline: float | None = None, caller: str = "local"
    ) -> InferResponse:
        """ModelInfer through the ValueService handlers: GetValues (all actions, Q and its
        argmax), or GetValues at one action per state (ACTION given), or GetBestActions.
        ``caller`` keys the new-point budget, exactly as for ValueService."""
        states, actions, wanted = self._parse(req)
        rid = req.model_version
        out: dict[str, npt.NDArray[Scalar]] = {}
        releases: set[str] = set()
        if actions is not None and Q in wanted:
            release, out[Q] = self.h.get_action_values(
                states, actions, release_id=rid, deadline=deadline, caller=caller
            )
            releases.add(release)
        if BEST_ACTION in wanted and (actions is not None or Q not in wanted):
            best = self.h.get_best_actions(states, release_id=rid, deadline=deadline, caller=caller)
            out[BEST_ACTION] = best.actions
            releases.add(best.release_id)
        if actions is None and Q in wanted:
            vals = self.h.get_values(states, release_id=rid, deadline=deadline, caller=caller)
            out[Q] = vals.values
            releases.add(vals.release_id)
            if BEST_ACTION in wanted:  # the argmax of these values, as get_best_actions does
                out[BEST_ACTION] = np.argmax(vals.values, axis=1).astype(np.int64)
        if len(releases) != 1:  # an activation between two handler calls of one request
            raise Unavailable("the active release changed during the request; retry")
        (release,) = releases
        tensors = []
        for name in wanted:
            data = out[name]
            dtype = "FP64" if name == Q else "INT64"
            tensors.append(Tensor(name, dtype, tuple(int(s) for s in data.shape), data))
        return InferResponse(MODEL_NAME, release, req.id, tuple(tensors))
