"""Shared by the v2 protocol tests: a real `qveil serve` subprocess with a
tokens file, a SQLite store (its answer log) and --http-port 0, whose answered values are
counted (GetStats); the tritonclient driver (its own process); tensors as JSON specs with
float.hex data; the list of bad inputs with their expected codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from server_helpers import ServerProcess, Tokens, make_bundle, make_tokens, start_server

from qveil.bundle import load_bundle

DRIVER = Path(__file__).resolve().parent / "oip_triton_driver.py"
MAX_BATCH = 16


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bundle = make_bundle(tmp / "bundles" / "b1", seed=3)
        self.b = load_bundle(self.bundle)
        self.tokens: Tokens = make_tokens(tmp / "tokens.toml")
        self.db = tmp / "store.sqlite"
        self.server: ServerProcess = start_server(
            tmp,
            self.bundle,
            "--tokens-file",
            str(self.tokens.path),
            "--max-batch",
            str(MAX_BATCH),
            "--http-port",
            "0",
            store=f"sqlite:///{self.db}",
        )
        self.http_port = int(self.server.rest_url().rsplit(":", 1)[1])

    @property
    def release(self) -> str:
        return str(self.b.bundle_id)

    def url(self, protocol: str) -> str:
        return self.server.target if protocol == "grpc" else f"127.0.0.1:{self.http_port}"

    def answered(self) -> int:
        """(state, action) values the server has answered (GetStats, admin token)."""
        from qveil.client import AdminClient

        with AdminClient(self.server.target, token=self.tokens.admin) as ad:
            return int(ad.stats().states_answered)

    def triton(
        self, protocol: str, ops: list[dict[str, Any]], token: str | None = "query"
    ) -> list[dict[str, Any]]:
        cfg = {
            "protocol": protocol,
            "url": self.url(protocol),
            "token": self.tokens.of(token),
            "ops": ops,
        }
        proc = subprocess.run(
            [sys.executable, str(DRIVER), json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out: list[dict[str, Any]] = json.loads(proc.stdout)
        return out


@contextmanager
def serving_env(tmp: Path) -> Iterator[Env]:
    """An :class:`Env` whose server must exit 0 on SIGTERM when the block ends."""
    e = Env(tmp)
    try:
        yield e
    finally:
        assert e.server.terminate() == 0, e.server.output()


def states_input(xs: Any, **kw: Any) -> dict[str, Any]:
    xs = np.asarray(xs, dtype=np.float64).reshape(-1, 1)
    spec = {
        "name": "STATE",
        "datatype": "FP64",
        "shape": list(xs.shape),
        "data": [float(v).hex() for v in xs.reshape(-1)],
    }
    return {**spec, **kw}


def action_input(acts: Any, **kw: Any) -> dict[str, Any]:
    acts = [int(a) for a in acts]
    return {"name": "ACTION", "datatype": "INT64", "shape": [len(acts)], "data": acts, **kw}


def decoded(result: dict[str, Any], name: str) -> Any:
    o = result["outputs"][name]
    if o["dtype"].startswith("float"):
        return np.array([float.fromhex(v) for v in o["data"]]).reshape(o["shape"])
    return np.array(o["data"], dtype=np.int64).reshape(o["shape"])


def hexes(a: Any) -> list[str]:
    return [float(v).hex() for v in np.asarray(a, dtype=np.float64).reshape(-1)]


# long-function: a table of bad requests, one entry per case
def bad_cases(env: Env) -> list[tuple[str, dict[str, Any], str, str]]:
    """(label, infer op, gRPC code, message fragment): a request that were wrongly accepted
    would be answered (and counted)."""
    fresh = [0.123456789, 0.987654321]
    big = np.linspace(-0.9, 1.9, MAX_BATCH + 1)
    return [
        (
            "wrong dtype",
            {"inputs": [{**states_input(fresh), "datatype": "INT32", "np": "INT32"}]},
            "INVALID_ARGUMENT",
            "expected FP64",
        ),
        (
            "wrong shape d=2",
            {"inputs": [{**states_input([0.1, 0.2, 0.3, 0.4]), "shape": [2, 2]}]},
            "INVALID_ARGUMENT",
            "d = 2",
        ),
        (
            "wrong shape rank 1",
            {"inputs": [{**states_input(fresh), "shape": [2]}]},
            "INVALID_ARGUMENT",
            "shape [n, d]",
        ),
        (
            "NaN",
            {"inputs": [states_input([0.5, float("nan")])]},
            "INVALID_ARGUMENT",
            "not a finite number",
        ),
        (
            "infinite",  # (a state outside the interval is clipped into it, not refused)
            {"inputs": [states_input([0.5, float("inf")])]},
            "INVALID_ARGUMENT",
            "not a finite number",
        ),
        (
            "unknown action",
            {"inputs": [states_input(fresh), action_input([0, 7])]},
            "INVALID_ARGUMENT",
            "unknown action 7",
        ),
        (
            "unknown action with BEST_ACTION",
            {
                "inputs": [states_input(fresh), action_input([-1, 0])],
                "outputs": ["Q", "BEST_ACTION"],
            },
            "INVALID_ARGUMENT",
            "unknown action -1",
        ),
        (
            "ACTION dtype",
            {
                "inputs": [
                    states_input(fresh),
                    {**action_input([0, 1]), "datatype": "INT32", "np": "INT32"},
                ]
            },
            "INVALID_ARGUMENT",
            "expected INT64",
        ),
        (
            "ACTION shape",
            {"inputs": [states_input(fresh), action_input([0, 1, 2])]},
            "INVALID_ARGUMENT",
            "ACTION must have shape",
        ),
        (
            "oversized",
            {"inputs": [states_input(big)]},
            "INVALID_ARGUMENT",
            f"exceeds the limit of {MAX_BATCH}",
        ),
        (
            "unknown output",
            {"inputs": [states_input(fresh)], "outputs": ["NOISE"]},
            "INVALID_ARGUMENT",
            "unknown output",
        ),
        (
            "unknown input",
            {"inputs": [states_input(fresh), {**states_input(fresh), "name": "WEIGHTS"}]},
            "INVALID_ARGUMENT",
            "unknown input",
        ),
        (
            "other model",
            {"inputs": [states_input(fresh)], "model": "resnet50"},
            "NOT_FOUND",
            "unknown model",
        ),
        (  # the same answer as an inactive release: no existence oracle for a query token
            "unknown version",
            {"inputs": [states_input(fresh)], "model_version": "no-such-release"},
            "FAILED_PRECONDITION",
            "is not the active release",
        ),
    ]


HTTP_STATUS = {
    "INVALID_ARGUMENT": "400",
    "NOT_FOUND": "404",
    "UNAUTHENTICATED": "401",
    "FAILED_PRECONDITION": "400",
}


API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def doc_block(marker: str, lang: str) -> str:
    """The first ```lang block after ``marker`` in docs/api.md, as written."""
    text = API_DOC.read_text()
    after = text[text.index(marker) :]
    return after.split(f"```{lang}\n", 1)[1].split("```", 1)[0]
