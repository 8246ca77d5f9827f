"""The query service answers what the release's key says, and exactly what it answered when
these answers were recorded.

``tests/data/serving_golden.json`` holds the SHA-256 of the answers (dtype, shape, bytes) of a
release with a seeded noise key to a fixed sequence of requests through every entry of the
serving path: ``QueryService.get_values`` (new states, repeated states, duplicates, batches of
1 to 1024, action subsets), ``get_best_actions``, ``get_action_values`` (the v2 model's one
action per state), and the wire bytes (release id blanked) of ``GetValuesResponse``
(``serde.values_to_proto``) and of the v2 ``ModelInferResponse`` (typed and raw contents). A
change of the hot path must keep every bit. Regenerate only for an intended change of the
answers: ``.venv/bin/python tests/unit/server/test_server_serving_query.py --write``. Every value is
also checked against ``qveil.answer.released_values`` (the answers' definition), whatever was asked
before it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "serving_golden.json"
LO, HI = -1.0, 2.0


def answers(tmp: Path, *, check: bool = False) -> dict[str, np.ndarray]:
    """The recorded sequence's answers; with ``check``, each values answer is also compared
    with ``released_values`` at its states (the key's answer, bit for bit)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from server_helpers import make_bundle, served_values

    from qveil.bundle import load_bundle
    from qveil.common.serde import values_to_proto
    from qveil.server.protocol.grpc.v2_servicer import response_to_proto
    from qveil.server.protocol.v2_model import InferRequest, OIPModel, Tensor
    from qveil.server.serving.services import Services
    from qveil.server.store import open_store

    out: dict[str, np.ndarray] = {}
    bundle = make_bundle(tmp / "bundle", seed=5, actions=3, hidden=16)
    b = load_bundle(bundle)
    with open_store(f"sqlite:///{tmp / 'store.sqlite'}") as st:
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
            vals = h.get_values(xs, acts)
            if check:
                want = served_values(b, xs, acts or None)
                assert vals.values.tobytes() == want.tobytes(), k
            out[f"values_{k}"] = vals.values
            msg = values_to_proto(vals)
            msg.release_id = ""  # the bundle's id changes with its creation time
            out[f"proto_{k}"] = np.frombuffer(msg.SerializeToString(), np.uint8)
            best = h.get_best_actions(xs)
            out[f"best_{k}"] = np.concatenate([best.actions.astype(np.float64), best.values])
            a = rng.integers(0, 3, n)
            av = h.get_action_values(xs, a)[1]
            if check:
                full = served_values(b, xs)
                assert av.tobytes() == full[np.arange(n), a].tobytes(), k
                assert best.values.tobytes() == full.max(axis=1).tobytes(), k
            out[f"action_values_{k}"] = av
            req = InferRequest(inputs=[Tensor("STATE", "FP64", (n, 1), xs)], id=f"r{k}")
            resp = model.infer(req)
            for raw in (False, True):
                v2 = response_to_proto(resp, raw=raw)
                v2.model_version = ""
                wire = v2.SerializeToString()
                out[f"v2_{k}_{int(raw)}"] = np.frombuffer(wire, np.uint8)
            seen = np.concatenate([seen, xs])
    return out


def digests(tmp: Path, *, check: bool = False) -> dict[str, str]:
    return {
        key: hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()
        for key, a in answers(tmp, check=check).items()
    }


def test_answers_are_the_recorded_ones(tmp_path: Path) -> None:
    want = json.loads(GOLDEN.read_text())
    got = digests(tmp_path, check=True)
    assert sorted(got) == sorted(want)
    assert [k for k in got if got[k] != want[k]] == []


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        with tempfile.TemporaryDirectory() as d:
            import os

            os.environ.setdefault("QVEIL_HOME", str(Path(d) / "home"))
            GOLDEN.write_text(json.dumps(digests(Path(d)), indent=0, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")


def test_states_map_as_the_state_box_does() -> None:
    """The query's clip-and-map of d-coordinate states (bounds kept per release) gives the
    bits of ``StateBox.to_unit(clip=True)``: inside, on and outside the box, -0.0, huge."""
    from types import SimpleNamespace

    from qveil.additive import StateBox
    from qveil.server.serving.limits import Limits
    from qveil.server.serving.query import QueryService
    from qveil.server.serving.state import ActiveRelease, ReleaseHolder, ServerContext

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
    from qveil.server.serving.query import _unit_few

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


def test_an_answer_does_not_depend_on_what_was_asked_before(tmp_path: Path) -> None:
    """Every answer is ``released_values`` at its states, bit for bit, whatever was asked
    before, in whatever batch and order: a state asked first alone or first in a batch of
    300, repeated, within a batch twice, for a subset of actions, by two services on two
    stores (one asked in the reverse order), all answer the same bits."""
    from server_helpers import served_values, serving_query

    rng = np.random.default_rng(8)
    xs = np.concatenate([rng.uniform(LO, HI, 298), [LO, HI]])
    xs[7] = xs[3]  # a repeat within the batch
    with (
        serving_query(tmp_path / "a", log=False) as (h1, _s1, _l1, b),
        serving_query(tmp_path / "b", log=False) as (h2, _s2, _l2, b2),
    ):
        want = served_values(b, xs)
        assert served_values(b2, xs).tobytes() == want.tobytes()  # one seed, one key
        # service 1: the batch first, then each state alone; service 2: alone first,
        # backwards, then the batch
        first = h1.get_values(xs).values
        alone = np.concatenate([h1.get_values(xs[i : i + 1]).values for i in range(xs.size)])
        backwards = [h2.get_values(xs[i : i + 1]).values for i in reversed(range(xs.size))]
        batch2 = h2.get_values(xs).values
        for got in (first, alone, np.concatenate(backwards[::-1]), batch2):
            assert got.tobytes() == want.tobytes()
        assert first[3].tobytes() == first[7].tobytes()
        sub = h1.get_values(xs[::-1], [2, 0]).values
        assert sub.tobytes() == want[::-1][:, [2, 0]].tobytes()
        best = h2.get_best_actions(xs)
        assert best.actions.tolist() == np.argmax(want, axis=1).tolist()
        assert best.values.tobytes() == want.max(axis=1).tobytes()


def test_every_state_costs_a_token_asked_before_or_not(tmp_path: Path) -> None:
    """The quota counts every state of a call (asked before or not, repeated in the call or
    not): a bucket of 5 states admits 3 and then refuses the same 3 again, whole; another
    caller has its own bucket; a refused call is not answered and logs nothing."""
    from server_helpers import serving_query

    from qveil.errors import ResourceExhausted

    with serving_query(tmp_path, state_rate=0.001, state_burst=5.0) as (h, st, log, _b):
        rid = h.holder.current().release_id
        xs = np.array([0.1, 0.2, 0.2])
        first = h.get_values(xs, caller="token:a")
        with pytest.raises(ResourceExhausted, match="state-rate") as ei:
            h.get_values(xs, caller="token:a")  # 3 > 2 left: asked before costs the same
        assert ei.value.retry_after == pytest.approx(1000.0, rel=0.01)
        with pytest.raises(ResourceExhausted):
            h.get_best_actions(np.array([0.6, 0.7, 0.8]), caller="token:a")
        h.get_values(np.array([0.4, 0.5]), caller="token:a")  # 2 left: fits
        again = h.get_values(xs, caller="token:b")  # its own bucket
        assert again.values.tobytes() == first.values.tobytes()
        with pytest.raises(ResourceExhausted, match="split the request"):
            h.get_values(np.linspace(0, 1, 6), caller="token:c")  # more than the bucket
        assert log.flush(30)
        assert st.count_points(rid) == 4 * 3  # 0.1, 0.2, 0.4, 0.5; nothing of the refused
        assert h.quotas.refused == {"state_rate": 3}


def test_a_subnormal_state_is_the_grid_point_beside_it(tmp_path: Path) -> None:
    """On a release of the interval [0, 1], the raw state 5e-324 (the smallest double) snaps
    to the grid point 0: it gets 0's answer, the log holds one state for both, and the audit
    with the key passes (no second state a hair from 0 for the whitening to divide by)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from server_helpers import make_bundle

    from qveil.bundle import load_bundle
    from qveil.server.governance.admin_db import admin_db_for
    from qveil.server.governance.audit import audit_store
    from qveil.server.serving.answer_log import AnswerLog
    from qveil.server.serving.services import Services
    from qveil.server.store import open_store

    b = load_bundle(make_bundle(tmp_path / "bundle", seed=6, interval=(0.0, 1.0)))
    with open_store(f"sqlite:///{tmp_path / 'store.sqlite'}") as st:
        services = Services.create(store=st)
        services.releases.start(b.path)
        log = AnswerLog(st, max_points=1000)
        log.start()
        h = services.query
        h.log = log
        zero = h.get_values(np.array([0.0])).values.tobytes()
        assert h.get_values(np.array([5e-324])).values.tobytes() == zero
        assert h.get_values(np.array([5e-324, 0.0])).values.tobytes() == zero * 2
        assert log.close(30)
        assert {p.x for p in st.iter_points(b.bundle_id, 0)} == {0.0}
        report = audit_store(
            st,
            admin_db_for(st),
            release_id=b.bundle_id,
            record=False,
            keys={b.bundle_id: b.noise_paths},
        )
        assert report.passed and report.releases[0].key_checked, report.to_json()
