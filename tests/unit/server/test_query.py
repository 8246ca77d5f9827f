"""The query service answers exactly what it answered when these answers were recorded.

``tests/data/serving_golden.json`` holds the SHA-256 of the answers (dtype, shape, bytes) of
a seeded store (``rng=`` seed: the noise is then a fixed sequence) to a fixed sequence of
requests through every entry of the serving path: ``QueryService.get_values`` (new states,
stored states, duplicates, batches of 1 to 1024, action subsets), ``get_stored_values`` (the
event loop's look-up of stored states), ``get_best_actions``, ``get_action_values`` (the v2
model's one action per state), and the wire bytes (release id blanked) of
``GetValuesResponse`` (``serde.values_to_proto``) and of the v2 ``ModelInferResponse``
(typed and raw contents). They were recorded before the serving path was vectorised; a
change of the hot path must keep every bit. Regenerate only for an intended change of the
answers: ``.venv/bin/python tests/unit/server/test_query.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "serving_golden.json"
LO, HI = -1.0, 2.0


def answers(tmp: Path) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from server_helpers import make_bundle

    from qveil.common.serde import values_to_proto
    from qveil.server.protocol.grpc.v2_servicer import response_to_proto
    from qveil.server.protocol.v2_model import InferRequest, OIPModel, Tensor
    from qveil.server.services import Services
    from qveil.server.store import open_store

    out: dict[str, np.ndarray] = {}
    bundle = make_bundle(tmp / "bundle", seed=5, actions=3, hidden=16)
    with open_store(f"sqlite:///{tmp / 'store.sqlite'}", rng=77) as st:
        services = Services.create(store=st)
        services.releases.start(bundle)
        h = services.query
        model = OIPModel(h)
        rng = np.random.default_rng(3)
        seen = rng.uniform(LO, HI, 64)
        for k in range(40):
            n = int(rng.choice([1, 1, 2, 7, 64, 300, 1024]))
            old = seen[rng.integers(0, seen.size, n)]
            fresh = rng.uniform(LO, HI, n)
            share = 0.0 if k < 4 else 1.0 if k % 3 == 0 else 0.7
            xs = np.where(rng.uniform(size=n) < share, old, fresh)
            if k % 5 == 4:
                xs = np.round(xs, 2)  # repeats within the batch
            acts = [[], [2, 0], [1]][k % 3]
            stored = h.get_stored_values(xs, acts)
            vals = h.get_values(xs, acts)
            out[f"values_{k}"] = vals.values
            msg = values_to_proto(vals)
            msg.release_id = ""  # the bundle's id changes with its creation time
            out[f"proto_{k}"] = np.frombuffer(msg.SerializeToString(), np.uint8)
            out[f"stored_{k}"] = np.zeros(0) if stored is None else stored.values
            best = h.get_best_actions(xs)
            out[f"best_{k}"] = np.concatenate([best.actions.astype(np.float64), best.values])
            a = rng.integers(0, 3, n)
            out[f"action_values_{k}"] = h.get_action_values(xs, a)[1]
            req = InferRequest(inputs=[Tensor("STATE", "FP64", (n, 1), xs)], id=f"r{k}")
            resp = model.infer(req)
            for raw in (False, True):
                v2 = response_to_proto(resp, raw=raw)
                v2.model_version = ""
                wire = v2.SerializeToString()
                out[f"v2_{k}_{int(raw)}"] = np.frombuffer(wire, np.uint8)
            seen = np.concatenate([seen, xs])
    return out


def digests(tmp: Path) -> dict[str, str]:
    return {
        key: hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()
        for key, a in answers(tmp).items()
    }


def test_answers_are_the_recorded_ones(tmp_path: Path) -> None:
    want = json.loads(GOLDEN.read_text())
    got = digests(tmp_path)
    assert sorted(got) == sorted(want)
    assert [k for k in got if got[k] != want[k]] == []


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        with tempfile.TemporaryDirectory() as d:
            GOLDEN.write_text(json.dumps(digests(Path(d)), indent=0, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")


def test_states_map_as_the_state_box_does() -> None:
    """The query's clip-and-map of d-coordinate states (bounds kept per release) gives the
    bits of ``StateBox.to_unit(clip=True)``: inside, on and outside the box, -0.0, huge."""
    from types import SimpleNamespace

    from qveil.additive import StateBox
    from qveil.server.limits import Limits
    from qveil.server.query import QueryService
    from qveil.server.state import ActiveRelease, ReleaseHolder, ServerContext

    box = StateBox.of([[-0.3, 0.3], [-1.5, 1.5], [-0.2095, 0.2095], [-2.0, 2.0]])
    rel = ActiveRelease(bundle=SimpleNamespace(dims=4, box=box), record=None)
    h = QueryService(ServerContext(store=None, holder=ReleaseHolder(), limits=Limits()))
    rng = np.random.default_rng(9)
    for n in (1, 2, 17, 1024):
        s = rng.normal(size=(n, 4)) * rng.choice([0.1, 1.0, 1e3], size=(n, 4))
        s[0, 0], s[-1, 1] = -0.0, 1.5
        got = h._states(rel, s)
        assert got.tobytes() == box.to_unit(s, clip=True).tobytes()
        assert h._states(rel, s).tobytes() == got.tobytes()  # the kept bounds


def test_few_states_map_with_python_floats_to_the_bits_of_numpy() -> None:
    """Requests of up to FEW coordinates are mapped with Python floats; on every
    finite input (on, inside and outside the bounds, -0.0, subnormals, huge) the bits are
    those of the numpy map and of ``StateBox.to_unit``, and a non-finite coordinate is
    refused naming the same state either way."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from qveil.additive import StateBox
    from qveil.errors import InvalidArgument
    from qveil.noise import FEW
    from qveil.server.query import _unit_few

    finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
    edges = st.sampled_from([-0.0, 0.0, 5e-324, -5e-324, 1e308, -1e308, -0.3, 0.3, 1.5])

    @st.composite
    def cases(draw: Any) -> tuple[np.ndarray, StateBox]:
        d = draw(st.integers(1, 4))
        n = draw(st.integers(1, FEW // d))
        bounds = []
        for _ in range(d):
            a, b = sorted(draw(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=2)))
            bounds.append([a, b if b > a else a + 1.0])
        vals = draw(st.lists(st.one_of(finite, edges), min_size=n * d, max_size=n * d))
        return np.array(vals, dtype=np.float64).reshape(n, d), StateBox.of(bounds)

    @settings(max_examples=300, deadline=None)
    @given(cases())
    def check(case: tuple[np.ndarray, StateBox]) -> None:
        s, box = case
        lo, hi = box.lo, box.hi
        got = _unit_few(s, lo.tolist(), hi.tolist(), (hi - lo).tolist())
        assert got.tobytes() == box.to_unit(s, clip=True).tobytes()

    check()
    s = np.array([[0.1, 0.2], [0.3, np.nan]])
    with pytest.raises(InvalidArgument, match="state at index 1"):
        _unit_few(s, [0.0, 0.0], [1.0, 1.0], [1.0, 1.0])


def test_a_batch_merges_and_finds_its_states_as_numpy_does() -> None:
    """The batch's union of each path's states and every state's place in it: np.unique
    and np.searchsorted, by Python floats for a few (bit for bit the same), numpy beyond."""
    from qveil.server.query import _positions, _union

    rng = np.random.default_rng(6)
    for sizes in ([1], [1, 1, 1], [3, 5, 8], [16, 1], [40, 7]):
        parts = [rng.choice(np.round(rng.uniform(0, 1, 12), 2), n) for n in sizes]
        parts[0][0] = 0.0
        got = _union(parts)
        want = np.unique(np.concatenate(parts))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        for u in parts:
            assert np.array_equal(np.asarray(_positions(got, u)), np.searchsorted(want, u))


@contextmanager
def _serving(tmp: Path, known: int = 0, **limits: object) -> Iterator[tuple[Any, Any, Any]]:
    """(query service, store, the ``known`` states it has answered, evenly over [-1, 2]) on a
    fresh SQLite store serving a 3-action bundle on [-1, 2]; the store is closed after."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from server_helpers import make_bundle

    from qveil.server.limits import Limits
    from qveil.server.services import Services
    from qveil.server.store import open_store

    bundle = make_bundle(tmp / "bundle", seed=5, actions=3, hidden=16)
    st = open_store(f"sqlite:///{tmp / 'store.sqlite'}")
    try:
        services = Services.create(store=st, limits=Limits(**limits))  # type: ignore[arg-type]
        services.releases.start(bundle)
        xs = np.linspace(-1.0, 2.0, known)
        if known:
            services.query.get_values(xs)
        yield services.query, st, xs
    finally:
        st.close()


def test_a_batch_answers_each_call_as_it_would_be_answered_alone(tmp_path: Path) -> None:
    """``get_values_many``: every call's answer is bit for bit what ``get_values`` answers
    for it afterwards (stored states and new ones, a new state shared by two calls, action
    subsets, duplicates); each new state is stored once, for every action; a call past its
    deadline gets its own error and stores nothing, without touching the others' answers.
    Bad requests are refused when they are parsed, before any batch, and store nothing."""
    import time

    from qveil.errors import FailedPrecondition, InvalidArgument
    from qveil.server.query import ValuesAsk

    with _serving(tmp_path, known=9) as (h, st, known):
        rid = h.holder.current().release_id
        shared = 0.123456789
        calls: list[tuple[np.ndarray, tuple[int, ...]]] = [
            (known[:3], ()),  # stored only
            (np.array([shared, 1.5, 1.5]), (2, 0)),  # new, a duplicate, two actions
            (np.array([shared]), (1,)),  # the same new state, another action
            (np.array([-0.5, known[4], -0.3]), ()),  # new and stored
        ]
        # a call the event loop looked up already goes to the store without a second
        # look-up: its stored states are read from the store, not drawn again
        asks = [
            ValuesAsk(h.parse(xs, acts), looked_up=k % 2 == 1) for k, (xs, acts) in enumerate(calls)
        ]
        asks.append(ValuesAsk(h.parse(np.array([0.76])), deadline=time.monotonic() - 1.0))
        before = st.count_points(rid)
        with pytest.raises(InvalidArgument, match="not a finite"):
            h.parse(np.array([0.51, np.nan]))
        with pytest.raises(InvalidArgument, match="coordinate"):
            h.parse(np.array([[0.3, 0.4]]))
        with pytest.raises(FailedPrecondition, match="not the active release"):
            h.parse(np.array([0.26]), release_id="another-release")
        out = h.get_values_many(asks)
        assert isinstance(out[4], TimeoutError)
        # new: shared (3 actions), 1.5 (2 actions; action 1 not asked), -0.5, -0.3 (3 each);
        # known[4] of the looked-up last call is not drawn again
        assert st.count_points(rid) == before + 3 + 2 + 3 + 3
        for (xs, acts), got in zip(calls, out, strict=False):
            assert not isinstance(got, Exception), got
            alone = h.get_values(xs, acts)
            assert got.actions == alone.actions and got.release_id == rid
            assert got.values.tobytes() == alone.values.tobytes()
        assert st.count_points(rid) == before + 11  # answered alone: nothing new
        for x in (0.51, 0.26, 0.76):  # the refused calls stored nothing
            assert h.get_stored_values(np.array([x])) is None


def test_a_batch_refuses_a_caller_over_its_budget_and_answers_the_others(
    tmp_path: Path,
) -> None:
    """Each call of a batch is admitted under its own caller's new-state budget: the caller
    over budget gets ResourceExhausted and stores nothing, the others are answered."""
    from qveil.errors import ResourceExhausted
    from qveil.server.query import ValuesAsk

    with _serving(tmp_path, new_state_rate=0.001, new_state_burst=2.0) as (h, _st, _known):
        asks = [
            ValuesAsk(h.parse(np.array([0.1, 0.2, 0.3])), caller="token:greedy"),
            ValuesAsk(h.parse(np.array([0.4, 0.5])), caller="token:modest"),
            ValuesAsk(h.parse(np.array([0.6])), caller="token:greedy"),
        ]
        out = h.get_values_many(asks)
        assert isinstance(out[0], ResourceExhausted) and "new state" in str(out[0])
        assert not isinstance(out[1], Exception) and not isinstance(out[2], Exception)
        assert h.get_stored_values(np.array([0.1])) is None
        assert h.get_stored_values(np.array([0.4, 0.5, 0.6])) is not None


def test_a_batch_on_a_full_disk_fails_every_new_call_and_answers_stored_ones(
    tmp_path: Path,
) -> None:
    """The batch's one store call fails (disk full): each call with new states then makes its
    own store call and gets its own Unavailable, nothing is stored, a call of stored states
    is still answered, and with space again the same batch is answered."""
    from qveil.errors import Unavailable
    from qveil.server.query import ValuesAsk

    with _serving(tmp_path, known=5) as (h, st, known):
        rid = h.holder.current().release_id
        pages = st._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        st._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        fresh = [np.random.default_rng(i).uniform(-1.0, 2.0, 40) for i in range(3)]
        asks = [ValuesAsk(h.parse(x)) for x in fresh] + [ValuesAsk(h.parse(known))]
        before = st.count_points(rid)
        out = h.get_values_many(asks)
        assert all(isinstance(o, Unavailable) and "disk full" in str(o) for o in out[:3]), out
        assert not isinstance(out[3], Exception)
        assert st.count_points(rid) == before
        st._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        again = h.get_values_many(asks)
        assert not any(isinstance(o, Exception) for o in again)
        assert st.count_points(rid) == before + 3 * 40 * 3
