"""A bounded grpc.aio load generator for a qveil server on loopback.

Open loop: one call is started every 1/rate seconds for `duration` seconds, never more than
`concurrency` at once (a tick that finds every slot busy is counted as `skipped`: the server
did not keep up with the offered rate). Each call is a GetValues batch mixing states from a
fixed pool (states asked again and again) with a fraction of fresh random states (never
asked: the server answers both the same way, and its answer log writes the new ones to the
store off the answer path). Stops by itself; loopback targets only.

    python benchmarks/loadgen.py --target 127.0.0.1:50051 --rate 200 --duration 10
    python benchmarks/loadgen.py --target 127.0.0.1:50051 --capacity 5   # closed-loop max rate

Prints one JSON object: sent, ok, errors by status code, skipped, achieved rate, latency
p50/p99/max in milliseconds. Used by tests/reliability/test_reliability_load.py and
scripts/reliability.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from qveil.v1 import value_service_pb2 as pb
from qveil.v1 import value_service_pb2_grpc as pb_grpc

__all__ = [
    "LoadResult",
    "RequestMix",
    "check_loopback",
    "find_sustainable_rate",
    "measure_capacity",
    "run_load",
]


@dataclass
class LoadResult:
    """What one load run saw. Latencies in milliseconds (successful and failed calls)."""

    target: str
    offered_rate: float
    duration_s: float
    concurrency: int
    sent: int = 0
    ok: int = 0
    skipped: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    states_sent: int = 0
    new_states_sent: int = 0
    achieved_rate: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    wall_s: float = 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["error_count"] = self.error_count
        return d


def check_loopback(target: str) -> None:
    """Refuse any target that does not resolve only to loopback addresses."""
    host = target.rsplit(":", 1)[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError as exc:
        raise ValueError(f"cannot resolve load target {target!r}: {exc}") from exc
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise ValueError(f"load target {target!r} is not loopback ({info[4][0]}): refused")


class RequestMix:
    """Builds GetValues requests: `batch` states, a fraction `new_fraction` of them fresh."""

    def __init__(
        self,
        *,
        low: float,
        high: float,
        batch: int = 8,
        new_fraction: float = 0.1,
        pool: int = 1000,
        actions: tuple[int, ...] = (),
        seed: int = 0,
    ) -> None:
        if not 0.0 <= new_fraction <= 1.0:
            raise ValueError(f"new_fraction must be in [0, 1], got {new_fraction}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.low, self.high = float(low), float(high)
        self.batch = int(batch)
        self.new_fraction = float(new_fraction)
        self.actions = tuple(actions)
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.uniform(self.low, self.high, size=max(1, int(pool)))

    def __call__(self) -> tuple[pb.GetValuesRequest, int]:
        n_new = int(self.rng.binomial(self.batch, self.new_fraction))
        fresh = self.rng.uniform(self.low, self.high, size=n_new)
        known = self.rng.choice(self.pool, size=self.batch - n_new)
        states = np.concatenate([fresh, known])
        return pb.GetValuesRequest(states=states.tolist(), actions=list(self.actions)), n_new


def _metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


async def _release_interval(
    channel: grpc.aio.Channel, token: str | None, timeout: float
) -> tuple[float, float, int]:
    stub = pb_grpc.ValueServiceStub(channel)
    reply = await stub.GetRelease(
        pb.GetReleaseRequest(), metadata=_metadata(token), timeout=timeout
    )
    r = reply.release
    return r.state_low, r.state_high, r.action_count


def _summarise(res: LoadResult, lat: list[float], codes: Counter[str], wall: float) -> LoadResult:
    res.ok = codes.pop("OK", 0)
    res.errors = dict(sorted(codes.items()))
    res.wall_s = wall
    res.achieved_rate = res.ok / res.duration_s if res.duration_s > 0 else 0.0
    if lat:
        arr = np.asarray(lat) * 1e3
        res.p50_ms, res.p99_ms, res.max_ms = (
            float(np.percentile(arr, 50)),
            float(np.percentile(arr, 99)),
            float(arr.max()),
        )
    return res


async def run_load(
    target: str,
    *,
    rate: float,
    duration: float,
    concurrency: int = 16,
    batch: int = 8,
    new_fraction: float = 0.1,
    pool: int = 1000,
    token: str | None = None,
    timeout: float = 10.0,
    seed: int = 0,
    make_request: Callable[[], tuple[pb.GetValuesRequest, int]] | None = None,
) -> LoadResult:
    """Offer `rate` calls/s for `duration` s with at most `concurrency` in flight; then wait for
    the calls still in flight (each bounded by its `timeout` deadline) and return the result."""
    if rate <= 0 or duration <= 0 or concurrency < 1:
        raise ValueError("rate and duration must be > 0 and concurrency >= 1")
    check_loopback(target)
    res = LoadResult(target=target, offered_rate=rate, duration_s=duration, concurrency=concurrency)
    lat: list[float] = []
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(target) as channel:
        if make_request is None:
            low, high, _m = await _release_interval(channel, token, timeout)
            make_request = RequestMix(
                low=low, high=high, batch=batch, new_fraction=new_fraction, pool=pool, seed=seed
            )
        stub = pb_grpc.ValueServiceStub(channel)
        md = _metadata(token)
        slots = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def one(req: pb.GetValuesRequest) -> None:
            t0 = time.perf_counter()
            try:
                await stub.GetValues(req, metadata=md, timeout=timeout)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
            finally:
                lat.append(time.perf_counter() - t0)
                slots.release()

        start = time.perf_counter()
        period = 1.0 / rate
        k = 0
        while True:
            due = start + k * period
            if due - start >= duration:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            k += 1
            if slots.locked():
                res.skipped += 1
                continue
            await slots.acquire()
            req, n_new = make_request()
            res.sent += 1
            res.states_sent += len(req.states)
            res.new_states_sent += n_new
            task = asyncio.create_task(one(req))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks))
        wall = time.perf_counter() - start
    return _summarise(res, lat, codes, wall)


async def measure_capacity(
    target: str,
    *,
    seconds: float,
    concurrency: int = 8,
    batch: int = 8,
    new_fraction: float = 0.1,
    pool: int = 1000,
    token: str | None = None,
    timeout: float = 10.0,
    seed: int = 1,
) -> LoadResult:
    """Closed loop: `concurrency` workers call back to back for `seconds`; achieved_rate is
    the capacity estimate (calls/s) at this mix."""
    check_loopback(target)
    res = LoadResult(
        target=target, offered_rate=float("inf"), duration_s=seconds, concurrency=concurrency
    )
    lat: list[float] = []
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(target) as channel:
        low, high, _m = await _release_interval(channel, token, timeout)
        mix = RequestMix(
            low=low, high=high, batch=batch, new_fraction=new_fraction, pool=pool, seed=seed
        )
        stub = pb_grpc.ValueServiceStub(channel)
        md = _metadata(token)
        start = time.perf_counter()

        async def worker() -> None:
            while time.perf_counter() - start < seconds:
                req, n_new = mix()
                res.sent += 1
                res.states_sent += len(req.states)
                res.new_states_sent += n_new
                t0 = time.perf_counter()
                try:
                    await stub.GetValues(req, metadata=md, timeout=timeout)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    res.duration_s = wall
    return _summarise(res, lat, codes, wall)


async def find_sustainable_rate(
    target: str,
    *,
    capacity: float,
    fractions: tuple[float, ...] = (0.3, 0.45, 0.6, 0.75),
    step_s: float = 5.0,
    concurrency: int = 48,
    p99_limit_ms: float = 250.0,
    **mix: Any,
) -> tuple[float, list[LoadResult]]:
    """Offer increasing fractions of the closed-loop ``capacity`` (calls/s) for ``step_s``
    each; the sustainable rate is the highest step with no error, no skipped tick and p99
    within ``p99_limit_ms`` (the first step's rate when none passes). Open-loop load needs
    headroom: a closed loop slows down with the server, an open loop queues."""
    best = fractions[0] * capacity
    steps: list[LoadResult] = []
    for f in fractions:
        r = await run_load(
            target, rate=f * capacity, duration=step_s, concurrency=concurrency, **mix
        )
        steps.append(r)
        if r.error_count or r.skipped or not r.p99_ms <= p99_limit_ms:
            break
        best = f * capacity
    return best, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT on loopback")
    p.add_argument("--rate", type=float, default=100.0, help="calls per second offered")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of offered load")
    p.add_argument("--concurrency", type=int, default=16, help="max calls in flight")
    p.add_argument("--batch", type=int, default=8, help="states per call")
    p.add_argument("--new-fraction", type=float, default=0.1, help="fraction of fresh states")
    p.add_argument("--pool", type=int, default=1000, help="size of the repeated-state pool")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline, seconds")
    p.add_argument("--token-file", type=Path, help="file holding a query-role bearer token")
    p.add_argument("--seed", type=int, default=0, help="seed of the state mix (not of noise)")
    p.add_argument(
        "--capacity",
        type=float,
        metavar="SECONDS",
        help="instead: closed-loop capacity measurement for SECONDS",
    )
    args = p.parse_args(argv)
    token = args.token_file.read_text().strip() if args.token_file else None
    common = {
        "concurrency": args.concurrency,
        "batch": args.batch,
        "new_fraction": args.new_fraction,
        "token": token,
        "timeout": args.timeout,
        "seed": args.seed,
    }
    if args.capacity:
        res = asyncio.run(measure_capacity(args.target, seconds=args.capacity, **common))
    else:
        res = asyncio.run(
            run_load(args.target, rate=args.rate, duration=args.duration, pool=args.pool, **common)
        )
    print(json.dumps(res.to_dict(), indent=2, default=float))
    return 0 if res.error_count == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
