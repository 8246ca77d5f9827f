"""One v2 client role against a qveil server, with tritonclient (grpc or http), in its OWN
process (tritonclient.grpc and qveil's server stubs cannot share a descriptor pool: see
oip_triton_driver.py); prints one JSON result.

    python backoff_driver.py '{"protocol": "grpc", "url": "127.0.0.1:PORT", "token": "...",
                               "role": "polite", "seed": 1, "batch": 10, "calls": 6,
                               "channel_args": [["grpc.enable_retries", 1], ...]}'

Roles:
* ``polite``: ``calls`` requests of ``batch`` new states each, one after the other; over gRPC
  the channel's retry policy (``channel_args``: the SDK's service config) waits as the
  server's pushback says. Every request must succeed.
* ``hostile``: ``threads`` threads send requests of ``batch`` new states for ``seconds``,
  with no retry policy, ignoring every refusal (no back-off at all).
* ``calm``: one request of ``batch`` new states every ``period`` seconds for ``seconds``,
  no retries: any refusal is visible.

Result: {"ok": calls answered, "states": new states answered, "codes": {status: count},
"elapsed": seconds from before the first call to after the last answer}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import numpy as np


def _client(cfg: dict[str, Any]) -> tuple[Any, Any]:
    if cfg["protocol"] == "grpc":
        import tritonclient.grpc as tc

        args = [tuple(a) for a in cfg.get("channel_args") or [("grpc.enable_retries", 0)]]
        return tc, tc.InferenceServerClient(url=cfg["url"], channel_args=args)
    import tritonclient.http as tc  # type: ignore[no-redef]

    return tc, tc.InferenceServerClient(url=cfg["url"])


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from tritonclient.utils import InferenceServerException

    tc, _ = _client(cfg)
    headers = {"authorization": f"Bearer {cfg['token']}"} if cfg.get("token") else None
    rng = np.random.default_rng(cfg["seed"])
    lo, hi, batch = float(cfg["lo"]), float(cfg["hi"]), int(cfg["batch"])
    lock = threading.Lock()
    codes: dict[str, int] = {}
    answered = [0, 0]

    def one(client: Any) -> None:
        with lock:
            xs = rng.uniform(lo, hi, size=(batch, 1))
        inp = tc.InferInput("STATE", [batch, 1], "FP64")
        inp.set_data_from_numpy(xs)
        try:
            client.infer("qveil", [inp], headers=headers)
            code = "OK"
        except InferenceServerException as exc:
            code = str(exc.status())
        except Exception as exc:  # noqa: BLE001 - reported, so the test sees it
            code = type(exc).__name__
        with lock:
            codes[code] = codes.get(code, 0) + 1
            if code == "OK":
                answered[0] += 1
                answered[1] += batch

    start = time.monotonic()
    role = cfg["role"]
    if role == "polite":
        client = _client(cfg)[1]
        for _ in range(int(cfg["calls"])):
            one(client)
        client.close()
    elif role == "hostile":
        stop = start + float(cfg["seconds"])

        def flood() -> None:  # one client per thread: tritonclient's are not thread-safe
            client = _client(cfg)[1]
            while time.monotonic() < stop:
                one(client)
            client.close()

        threads = [threading.Thread(target=flood) for _ in range(int(cfg.get("threads", 2)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif role == "calm":
        client = _client(cfg)[1]
        stop = start + float(cfg["seconds"])
        while time.monotonic() < stop:
            one(client)
            time.sleep(float(cfg["period"]))
        client.close()
    else:
        raise ValueError(f"unknown role {role!r}")
    elapsed = time.monotonic() - start
    return {"ok": answered[0], "states": answered[1], "codes": codes, "elapsed": elapsed}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
