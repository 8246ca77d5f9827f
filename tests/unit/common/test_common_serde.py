"""Proto <-> qveil type round trips, the stub drift check, and the client's light imports
(the error table as the client reads it back: test_common_errors.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from server_helpers import REPO

from qveil.common import serde as convert
from qveil.common import typing as t
from qveil.v1 import value_service_pb2 as value_pb


def test_release_round_trip() -> None:
    r = t.Release(
        release_id="abc",
        mode="output",
        epsilon=1.5,
        delta=1e-5,
        delta_total=2e-5,
        holds=True,
        basis="Theorem X",
        reason=None,
        sigma=2.0,
        beta=0.8,
        interval=(-1.0, 2.0),
        n_actions=3,
        created_at=datetime(2026, 11, 22, 5, 0, tzinfo=UTC),
        status="active",
        seeded=True,
        env_id="LineWalk-v0",
        q_bound=5.0,
        value_grid=2.0**-20,
        card={"bundle_id": "abc", "k": [1, 2]},
    )
    assert convert.release_from_proto(convert.release_to_proto(r)) == r
    r2 = replace(r, q_bound=None, created_at=None, reason="no", status="retired")
    assert convert.release_from_proto(convert.release_to_proto(r2)) == r2


def test_values_and_best_round_trip() -> None:
    v = t.Values(
        release_id="r", actions=(2, 0), values=np.arange(6.0).reshape(3, 2), value_grid=0.5
    )
    back = convert.values_from_proto(convert.values_to_proto(v))
    assert back.actions == v.actions and back.release_id == "r"
    np.testing.assert_array_equal(back.values, v.values)
    b = t.BestActions(
        release_id="r", actions=np.array([0, 2]), values=np.array([1.0, -2.0]), value_grid=0.25
    )
    bb = convert.best_actions_from_proto(convert.best_actions_to_proto(b))
    np.testing.assert_array_equal(bb.actions, b.actions)
    np.testing.assert_array_equal(bb.values, b.values)


def _random_values(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """Finite, NaN-free values of every kind: zeros of both signs, grid multiples, huge,
    tiny and subnormal magnitudes."""
    v = rng.normal(0, 1, (n, width)) * 10.0 ** rng.integers(-300, 300, (n, width))
    kinds = rng.integers(0, 6, (n, width))
    v[kinds == 0] = -0.0
    v[kinds == 1] = 0.0
    v[kinds == 2] = np.round(v[kinds == 2] * 1e-300 / 0.25) * 0.25
    v[kinds == 3] = 5e-324 * rng.integers(-9, 9, int((kinds == 3).sum()))
    return v


@pytest.mark.parametrize("width", [1, 4])
def test_values_to_proto_bytes_as_from_lists(width: int) -> None:
    """The packed values built from the array's bytes serialize exactly as the message built
    from a Python list of floats did, -0.0 and subnormals included, 0 and 1 states too."""
    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.server.protocol.grpc.v2_servicer import response_to_proto
    from qveil.server.protocol.v2_model import InferResponse, Tensor

    rng = np.random.default_rng(width)
    for n in [0, 1, 2, 3, 17, 1024, *rng.integers(0, 3000, 20).tolist()]:
        vals = _random_values(rng, int(n), width)
        acts = tuple(rng.permutation(max(width, 5))[:width].tolist())
        v = t.Values(release_id="r-1", actions=acts, values=vals, value_grid=0.125)
        old = value_pb.GetValuesResponse(
            release_id="r-1", actions=list(acts), values=vals.ravel().tolist(), value_grid=0.125
        )
        new = convert.values_to_proto(v)
        assert new.SerializeToString() == old.SerializeToString()
        assert new == old
        back = np.asarray(new.values, dtype=np.float64)
        assert back.tobytes() == vals.ravel().tobytes()

        out = Tensor("values", "FP64", vals.shape, vals)
        best = Tensor("action", "INT64", (int(n),), rng.integers(0, 5, int(n)))
        resp = InferResponse(model_name="qveil", model_version="1", id="x", outputs=(out, best))
        ref = pb.ModelInferResponse(model_name="qveil", model_version="1", id="x")
        o = ref.outputs.add(name="values", datatype="FP64", shape=list(vals.shape))
        o.contents.fp64_contents.extend(vals.ravel().tolist())
        o = ref.outputs.add(name="action", datatype="INT64", shape=[int(n)])
        o.contents.int64_contents.extend(best.data.tolist())
        got = response_to_proto(resp, raw=False)
        assert got.SerializeToString() == ref.SerializeToString()
        assert got == ref


def test_packed_varints_bytes_as_from_lists() -> None:
    """Varints built with numpy serialize exactly as protobuf writes a list of ints: every
    width from 1 to 10 bytes, negatives (sign-extended), 0, the int64 extremes; and the
    GetBestActions answer built from arrays is the one built from lists."""
    from qveil.oip import grpc_predict_v2_pb2 as pb

    field = pb.InferTensorContents.DESCRIPTOR.fields_by_name["int64_contents"].number
    rng = np.random.default_rng(8)
    edges = [0, 1, 127, 128, 2**14 - 1, 2**14, 2**62, 2**63 - 1, -1, -(2**63), -128]
    for n in [0, 1, 2, 5, 300]:
        for scale in (4, 2**20, 2**62):
            ints = rng.integers(-scale, scale, n) if n else np.zeros(0, np.int64)
            ints = np.concatenate([ints, edges]) if n > 2 else ints
            ref = pb.InferTensorContents(int64_contents=ints.tolist())
            got = pb.InferTensorContents()
            got.MergeFromString(convert.packed_varints(field, ints))
            assert got.SerializeToString() == ref.SerializeToString()
            assert list(got.int64_contents) == ints.tolist()
        acts = rng.integers(0, 7, n)
        vals = _random_values(rng, n, 1).ravel()
        b = t.BestActions(release_id="r", actions=acts, values=vals, value_grid=0.5)
        old = value_pb.GetBestActionsResponse(
            release_id="r", actions=acts.tolist(), values=vals.tolist(), value_grid=0.5
        )
        assert convert.best_actions_to_proto(b).SerializeToString() == old.SerializeToString()


def test_audit_and_stats_round_trip() -> None:
    p = t.NoisePoint(seq=7, x=0.25, state=-0.25, g=-1.5, created_at=None, hash="ab")
    assert convert.noise_point_from_proto(convert.noise_point_to_proto(p)) == p
    i = t.IntegrityResult(
        release_id="r",
        ok=False,
        actions=(
            t.ActionIntegrity(
                action=1,
                ok=False,
                count=3,
                high_water_mark=4,
                first_broken_seq=2,
                gaps=(3,),
                message="broken",
            ),
            t.ActionIntegrity(
                action=0,
                ok=True,
                count=1,
                high_water_mark=1,
                first_broken_seq=None,
                gaps=(),
                message="",
            ),
        ),
        report={"ok": False},
    )
    assert convert.integrity_from_proto(convert.integrity_to_proto(i)) == i
    s = t.StatisticalReport(
        release_id="r",
        passed=True,
        actions=(
            t.ActionNormality(action=0, n=10, ks_p=0.5, chi2_p=0.4, mean=0.1, var=1.1, passed=True),
        ),
        report={"a": 1},
    )
    assert convert.report_from_proto(convert.report_to_proto(s)) == s
    st = t.ServerStats(
        active_release_id="r",
        uptime_seconds=1.5,
        requests_by_code={"OK": 3},
        states_answered=9,
        new_points=4,
        in_flight=1,
        max_in_flight=64,
        stored_points={0: 3, 1: 5},
        max_batch=4096,
    )
    assert convert.stats_from_proto(convert.stats_to_proto(st)) == st


def test_grid_rounding_is_exact_multiple() -> None:
    from qveil.server.serving.query import grid_round

    rng = np.random.default_rng(1)
    v = rng.normal(scale=3, size=10_000)
    g = 2.0**-20
    r = grid_round(v, g)
    assert np.all(np.abs(r - v) <= g / 2)
    assert np.all(np.mod(r, g) == 0)
    assert not math.copysign(1, grid_round(np.array([-1e-9]), g)[0]) < 0  # no -0.0


def test_client_imports_no_torch_or_sqlalchemy() -> None:
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, qveil.client, qveil.client.commands.query; "
            "bad=[m for m in sys.modules if m.split('.')[0] in "
            "('torch','sqlalchemy')]; assert not bad, bad",
        ],
        check=True,
        cwd=REPO,
    )


def test_generated_stubs_do_not_drift() -> None:
    r = subprocess.run(
        ["bash", "scripts/gen_proto.sh", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _qveil_imports(folder: str) -> set[tuple[str, str]]:
    """(file, module) of every qveil import under ``folder``, at any depth of the code
    (imports inside functions included)."""
    import ast

    found: set[tuple[str, str]] = set()
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            rel = path.relative_to(REPO / folder).as_posix()
            found |= {(rel, n) for n in names if n.startswith("qveil")}
    return found


def test_wire_layer_is_shared_not_borrowed() -> None:
    """The server stands on qveil.common, never on the client; qveil.common stands on
    neither (so the light client distribution can ship it). The one exception is the
    operator command ``qveil admin --target`` (commands/admin.py), which drives a remote server
    through the SDK's AdminClient."""
    server = {
        (f, m)
        for f, m in _qveil_imports("server")
        if m.startswith("qveil.client") and f != "qveil/server/commands/admin.py"
    }
    assert not server, server
    common = {
        (f, m)
        for f, m in _qveil_imports("common")
        if m.startswith(("qveil.client", "qveil.server", "qveil.trainer"))
    }
    assert not common, common
