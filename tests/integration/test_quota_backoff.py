"""Clients that wait when told to, and clients that do not, against a real `qveil serve` with a
small state budget (``--state-rate 20 --state-burst 20``, one bucket per token; every state
counted).

For each transport (qveil.v1 ValueService through the SDK; v2 gRPC through tritonclient.grpc
with the SDK's service config; v2 REST through httpx and curl, which honour Retry-After):

* a polite client over its budget waits as the server says (gRPC retry pushback, HTTP
  Retry-After) and every request succeeds, taking at least as long as the rate demands;
* a hostile client (two threads, no back-off, refusals ignored) is held to the rate: the
  states it gets answered are at most burst + rate x elapsed;
* a well-behaved client beside it (its own token, well under the rate, no retries) is never
  refused;
* a refused request answers nothing: the server's count of answered values (GetStats) is
  exactly the answered states' values.

Counts decide every assertion; the only timing bounds are the rate's own (a lower bound on
the polite client's time, an upper bound on the hostile client's states), so a slow machine
cannot fail them. Each test was run 20 times in a loop before committing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess, make_bundle, make_tokens, start_server

from qveil.client import ResourceExhaustedError, RetryPolicy, ValueClient
from qveil.server.serving.auth import add_token

RATE, BURST = 20.0, 20.0
ACTIONS = 3  # make_bundle's default
LO, HI = -1.0, 2.0  # make_bundle's interval
FLOOD_S = 3.0
DRIVER = Path(__file__).resolve().parents[1] / "backoff_driver.py"


class World:
    def __init__(self, tmp: Path) -> None:
        self.db = tmp / "store.sqlite"
        tokens = make_tokens(tmp / "tokens.toml")
        self.admin = tokens.admin
        self.polite = tokens.query
        self.hostile = add_token(tokens.path, "query", "hostile")
        self.calm = add_token(tokens.path, "query", "calm")
        self.srv: ServerProcess = start_server(
            tmp,
            make_bundle(tmp / "b"),
            "--tokens-file",
            str(tokens.path),
            "--state-rate",
            str(RATE),
            "--state-burst",
            str(BURST),
            "--http-port",
            "0",
            store=f"sqlite:///{self.db}",
        )
        self.http = self.srv.rest_url().removeprefix("http://")

    def rows(self) -> int:
        """(state, action) values the server answered (GetStats)."""
        from qveil.client import AdminClient

        with AdminClient(self.srv.target, token=self.admin) as ad:
            return int(ad.stats().states_answered)


@pytest.fixture
def world(tmp_path: Path) -> Any:
    w = World(tmp_path)
    try:
        yield w
    finally:
        assert w.srv.terminate() == 0


def _driver(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    res: dict[str, Any] = json.loads(out)
    return res


def _held_to_rate(hostile: dict[str, Any]) -> None:
    bound = BURST + RATE * hostile["elapsed"]
    assert hostile["states"] <= bound, hostile
    refused = sum(n for code, n in hostile["codes"].items() if code != "OK")
    assert refused > 0, hostile  # it did outrun the budget
    assert set(hostile["codes"]) <= {"OK", "429", "StatusCode.RESOURCE_EXHAUSTED"}, hostile


def _polite_time(states: int) -> float:
    """The least time the rate allows for ``states`` states (a small clock margin)."""
    return (states - BURST) / RATE - 0.05


# ----------------------------------------------------------------------------- qveil.v1 (SDK)
def test_value_service_sdk_waits_hostile_held_calm_served(world: World) -> None:
    t0 = time.monotonic()
    with ValueClient(world.srv.target, token=world.polite) as c:  # the SDK's default policy
        rng = np.random.default_rng(1)
        for _ in range(6):  # 60 states: 40 beyond the bucket, 2 s at the rate
            assert c.values(rng.uniform(LO, HI, 10)).shape == (10, ACTIONS)
    polite_s = time.monotonic() - t0
    assert polite_s >= _polite_time(60)

    no_retry = RetryPolicy(attempts=1)
    hostile: dict[str, Any] = {"codes": {}, "states": 0}
    calm: dict[str, int] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + FLOOD_S

    def flood(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with ValueClient(world.srv.target, token=world.hostile, retry=no_retry) as h:
            while time.monotonic() < stop_at:
                try:
                    h.values(rng.uniform(LO, HI, 2))
                    code = "OK"
                except ResourceExhaustedError:
                    code = "StatusCode.RESOURCE_EXHAUSTED"
                with lock:
                    hostile["codes"][code] = hostile["codes"].get(code, 0) + 1
                    hostile["states"] += 2 if code == "OK" else 0

    def steady() -> None:
        rng = np.random.default_rng(7)
        with ValueClient(world.srv.target, token=world.calm, retry=no_retry) as k:
            while time.monotonic() < stop_at:
                try:
                    k.values(rng.uniform(LO, HI, 1))
                    code = "OK"
                except Exception as exc:  # noqa: BLE001 - any failure is a starved client
                    code = type(exc).__name__
                calm[code] = calm.get(code, 0) + 1
                time.sleep(0.25)

    threads = [threading.Thread(target=flood, args=(s,)) for s in (2, 3)]
    threads.append(threading.Thread(target=steady))
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    hostile["elapsed"] = time.monotonic() - start
    _held_to_rate(hostile)
    assert set(calm) == {"OK"} and calm["OK"] >= 5, calm
    assert world.rows() == (60 + hostile["states"] + calm["OK"]) * ACTIONS


# ----------------------------------------------------------------------------- v2 gRPC
def test_v2_grpc_tritonclient_waits_hostile_held_calm_served(world: World) -> None:
    url = world.srv.target
    polite = _result(
        _driver(
            {
                "protocol": "grpc",
                "url": url,
                "token": world.polite,
                "role": "polite",
                "seed": 1,
                "lo": LO,
                "hi": HI,
                "batch": 10,
                "calls": 6,
                "channel_args": RetryPolicy().channel_args(),
            }
        )
    )
    assert polite["codes"] == {"OK": 6}, polite
    assert polite["elapsed"] >= _polite_time(60)
    common = {"protocol": "grpc", "url": url, "lo": LO, "hi": HI, "seconds": FLOOD_S}
    h = _driver({**common, "token": world.hostile, "role": "hostile", "seed": 2, "batch": 2})
    k = _driver(
        {**common, "token": world.calm, "role": "calm", "seed": 3, "batch": 1, "period": 0.25}
    )
    k.wait(timeout=120)
    hostile, calm = _result(h), _result(k)
    _held_to_rate(hostile)
    assert set(calm["codes"]) == {"OK"} and calm["ok"] >= 5, calm
    assert world.rows() == (60 + hostile["states"] + calm["states"]) * ACTIONS


# ----------------------------------------------------------------------------- v2 REST
def _infer_body(xs: np.ndarray) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "STATE", "datatype": "FP64", "shape": [len(xs), 1], "data": xs.tolist()}
        ]
    }


def test_v2_rest_retry_after_honoured_hostile_held_calm_served(world: World) -> None:
    url = f"http://{world.http}/v2/models/qveil/infer"
    auth = {"authorization": f"Bearer {world.polite}"}
    rng = np.random.default_rng(1)
    waits: list[int] = []
    t0 = time.monotonic()
    with httpx.Client(timeout=30) as http:
        for _ in range(6):  # 60 states; a standard HTTP client waits out each 429
            body = _infer_body(rng.uniform(LO, HI, 10))
            for _attempt in range(10):
                r = http.post(url, json=body, headers=auth)
                if r.status_code != 429:
                    break
                waits.append(int(r.headers["retry-after"]))
                time.sleep(waits[-1])
            assert r.status_code == 200, r.text
    assert time.monotonic() - t0 >= _polite_time(60)
    assert waits and all(w >= 1 for w in waits), waits
    # curl --retry honours Retry-After: the bucket is empty, so curl is told to wait first
    curl_body = json.dumps(_infer_body(rng.uniform(LO, HI, 20)))  # the whole bucket
    t1 = time.monotonic()
    cp = subprocess.run(
        ["curl", "--no-progress-meter", "--fail", "--retry", "5", "-X", "POST"]
        + ["-H", f"authorization: Bearer {world.polite}", "-H", "content-type: application/json"]
        + ["--data-binary", curl_body, url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["outputs"], cp.stdout
    assert time.monotonic() - t1 >= 0.5  # it waited (20 states at 20/s: ~1 s)
    assert "Will retry in" in cp.stderr, cp.stderr

    common = {"protocol": "http", "url": world.http, "lo": LO, "hi": HI, "seconds": FLOOD_S}
    h = _driver({**common, "token": world.hostile, "role": "hostile", "seed": 2, "batch": 2})
    k = _driver(
        {**common, "token": world.calm, "role": "calm", "seed": 3, "batch": 1, "period": 0.25}
    )
    hostile, calm = _result(h), _result(k)
    _held_to_rate(hostile)
    assert set(calm["codes"]) == {"OK"} and calm["ok"] >= 5, calm
    assert world.rows() == (60 + 20 + hostile["states"] + calm["states"]) * ACTIONS


def test_no_retry_when_retrying_cannot_help(world: World) -> None:
    """A request larger than the whole bucket, or a wait past the call's deadline, is refused
    at once (pushback -1): the SDK raises RESOURCE_EXHAUSTED with the server's message
    instead of waiting; REST sends no Retry-After for the first."""
    with ValueClient(world.srv.target, token=world.polite, timeout=30) as c:
        t0 = time.monotonic()
        with pytest.raises(ResourceExhaustedError, match="split the request") as ei:
            c.values(np.linspace(LO, HI, 21))
        assert ei.value.retry_delay is None
        c.values(np.linspace(LO, HI, 20))  # the whole bucket
        with pytest.raises(ResourceExhaustedError, match="retry in") as ei:
            c.values(np.linspace(LO, 0.0, 20) + 0.001, timeout=0.5)  # needs ~1 s
        assert ei.value.retry_delay is not None and ei.value.retry_delay > 0.5
        assert time.monotonic() - t0 < 0.5 + 5  # not DEADLINE_EXCEEDED after waiting
    r = httpx.post(
        f"http://{world.http}/v2/models/qveil/infer",
        json=_infer_body(np.linspace(LO, HI - 0.01, 21) + 0.002),
        headers={"authorization": f"Bearer {world.calm}"},
        timeout=30,
    )
    assert r.status_code == 429 and "retry-after" not in r.headers, r.headers
    assert world.rows() == 20 * ACTIONS
