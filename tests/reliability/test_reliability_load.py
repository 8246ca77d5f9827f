"""Load and soak with benchmarks/loadgen.py against a real server.

1. Soak: the server's capacity at a realistic mix (8 states per call, 10 % of them new, the
   rest from a pool of 1000 repeated states) is measured closed-loop first; then open-loop
   steps at rising fractions of it find the highest rate that holds (no error, no skipped
   tick, p99 within 250 ms; quick form: one step at 30 %), and loadgen holds 80 % of that
   rate for 120 s (full) / 50 % of it for 8 s (quick: beside the suite's other worker). Zero
   errors, (almost) no call skipped for lack of a free slot (full: 1 %; quick: 10 %), the
   server's RSS bounded (after warm-up it may grow only by what the logged points explain),
   the answer log growing by the distinct states (never by the number of queries; counted
   after the graceful stop, which flushes the log), and p50/p99 recorded.
2. Overload: with --max-in-flight 4 (per caller: 3), one client flooding with 32 concurrent
   heavy calls over its connection gets RESOURCE_EXHAUSTED for the excess and nothing else;
   every admitted call is answered correctly (re-checked, and the release's keyed values); an
   in-limit client (its own connection, one call at a time) is unaffected: not one refusal,
   during the flood or after.
   A wrong (global-only) bound refuses the in-limit client part of the time: 30 % of its calls
   in the quick form and 84-90 % in the full form were measured before the per-caller bound.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from reliability_helpers import (
    AnswerBook,
    assert_answers_are_the_keys,
    get_values,
    recheck,
    release_info,
    report,
    scale,
    sqlite_url,
    start_server,
)

from qveil.server.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import loadgen  # noqa: E402

pytestmark = pytest.mark.slow


class RssSampler(threading.Thread):
    def __init__(self, srv, period: float = 0.25) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.srv, self.period = srv, period
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.is_set():
            self.samples.append((time.monotonic() - t0, self.srv.rss()))
            time.sleep(self.period)


# long-function: one soak top to bottom: measure capacity, find the sustainable rate, hold it,
#   recheck every answer, report
def test_soak_at_the_measured_sustainable_rate(tmp_path: Path, bundle: Path) -> None:
    store_url = sqlite_url(tmp_path / "store.sqlite")
    srv = start_server(tmp_path, bundle=bundle, store=store_url)
    duration = float(scale(8, 120))
    batch, new_fraction, pool = 8, 0.1, 1000
    try:
        cap = asyncio.run(
            loadgen.measure_capacity(
                srv.target,
                seconds=float(scale(2, 10)),
                concurrency=8,
                batch=batch,
                new_fraction=new_fraction,
                pool=pool,
            )
        )
        assert cap.error_count == 0, f"errors while measuring capacity: {cap.errors}"
        held, steps = asyncio.run(
            loadgen.find_sustainable_rate(
                srv.target,
                capacity=cap.achieved_rate,
                fractions=tuple(scale((0.3,), (0.2, 0.3, 0.45, 0.6))),
                step_s=float(scale(2, 10)),
                concurrency=48,
                batch=batch,
                new_fraction=new_fraction,
                pool=pool,
            )
        )
        # a short step that held is not yet a soak: keep a margin for the long run, 20 % in
        # the full form (the machine to itself); the quick form runs inside `make test`, where
        # the other pytest-xdist worker's tests take the cores at their own times, so the
        # capacity measured here is not the capacity during the soak: a 50 % margin
        rate = float(scale(0.5, 0.8)) * held
        rss_before = srv.rss()
        sampler = RssSampler(srv)
        sampler.start()
        res = asyncio.run(
            loadgen.run_load(
                srv.target,
                rate=rate,
                duration=duration,
                concurrency=48,
                batch=batch,
                new_fraction=new_fraction,
                pool=pool,
                seed=7,
            )
        )
        sampler.stop.set()
        sampler.join()
        alive = srv.alive()
    finally:
        srv.terminate()
    assert alive
    assert res.error_count == 0, f"errors at the sustainable rate: {res.errors}"
    assert res.ok == res.sent
    # the sustained-rate claim (1 % of ticks at most found every slot busy) is the full
    # form's, on a machine to itself; the quick form shares the cores with the suite's other
    # worker and with whatever else runs, whose bursts stretch latencies past the 48 slots for
    # a few ticks (a fresh clone beside a second suite: 16 of 558): it asserts the run was not
    # starved (at most 10 %), besides every answer being right
    limit = float(scale(0.10, 0.01))
    assert res.skipped <= limit * (res.sent + res.skipped), (
        f"{res.skipped} ticks found every slot busy: the rate was not sustained"
    )
    # memory: after the first 20 % (warm-up), growth explained by stored points only
    rss = np.array([r for _, r in sampler.samples if r > 0], dtype=float)
    warm = rss[len(rss) // 5]
    peak = rss[len(rss) // 5 :].max()
    store = open_store(store_url, create=False)
    try:
        rows = store.count_points()
    finally:
        store.close()
    m = 2
    growth_allowance = 32 * 2**20 + 2048 * res.new_states_sent * m
    assert peak - warm <= growth_allowance, (
        f"RSS grew {(peak - warm) / 2**20:.1f} MiB during the soak "
        f"(allowance {growth_allowance / 2**20:.1f} MiB for {res.new_states_sent} new states)"
    )
    # the log: one row per distinct state and action, never per query
    ramp_new = sum(r.new_states_sent for r in steps)
    upper = m * (cap.new_states_sent + ramp_new + res.new_states_sent + 3 * pool)
    lower = m * res.new_states_sent
    assert lower <= rows <= upper, f"stored rows {rows} not in [{lower}, {upper}]"
    db_bytes = sum(p.stat().st_size for p in tmp_path.glob("store.sqlite*"))
    report(
        "load_soak",
        capacity_calls_per_s=round(cap.achieved_rate, 1),
        rate=round(rate, 1),
        ramp={
            f"{r.offered_rate:.0f}/s": f"p99 {r.p99_ms:.0f} ms, skipped {r.skipped}, "
            f"errors {r.error_count}"
            for r in steps
        },
        batch=batch,
        new_fraction=new_fraction,
        duration_s=duration,
        sent=res.sent,
        ok=res.ok,
        errors=res.error_count,
        skipped=res.skipped,
        p50_ms=res.p50_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        states_answered=res.states_sent,
        new_states=res.new_states_sent,
        rss_start_mib=round(rss_before / 2**20, 1),
        rss_warm_mib=round(warm / 2**20, 1),
        rss_peak_mib=round(peak / 2**20, 1),
        stored_rows=rows,
        store_bytes_per_row=round(db_bytes / max(rows, 1), 1),
        unexpected_errors={},
    )


# long-function: one overload top to bottom: a calm client and a flood past the in-flight bound,
#   then the codes each saw, every answer rechecked, report
def test_overload_gets_resource_exhausted(tmp_path: Path, bundle: Path) -> None:
    bound = 4
    srv = start_server(
        tmp_path,
        bundle=bundle,
        store=sqlite_url(tmp_path / "store.sqlite"),
        extra=["--max-in-flight", str(bound)],
    )
    flood_s = float(scale(3, 20))
    book = AnswerBook()
    calm = AnswerBook()
    stop = threading.Event()
    try:
        rel = release_info(srv.target)
        known = np.linspace(rel.state_low, rel.state_high, 64).tolist()

        def calm_client(phase: str) -> None:
            from qveil.v1 import value_service_pb2_grpc as vgrpc

            # its own connection: channels of one process otherwise share gRPC's global
            # subchannel pool, i.e. one connection, i.e. one anonymous caller
            own = [("grpc.use_local_subchannel_pool", 1)]
            with grpc.insecure_channel(srv.target, options=own) as ch:
                stub = vgrpc.ValueServiceStub(ch)
                while not stop.is_set():
                    try:
                        r = get_values(stub, known, timeout=10)
                        calm.add(r.release_id, known, list(r.actions), list(r.values))
                    except grpc.RpcError as exc:
                        calm.error(f"{phase}:{exc.code().name}")
                    time.sleep(0.02)

        from qveil.v1 import value_service_pb2_grpc as vgrpc

        # the flooding client: one connection, 32 threads calling concurrently through it
        flood_channel = grpc.insecure_channel(srv.target)
        flood_stub = vgrpc.ValueServiceStub(flood_channel)

        def flood_worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                states = rng.uniform(rel.state_low, rel.state_high, 256).tolist()
                try:
                    r = get_values(flood_stub, states, timeout=30)
                    book.add(r.release_id, states, list(r.actions), list(r.values))
                except grpc.RpcError as exc:
                    book.error(exc.code().name)

        c = threading.Thread(target=calm_client, args=("flood",), daemon=True)
        c.start()
        flood = [threading.Thread(target=flood_worker, args=(i,), daemon=True) for i in range(32)]
        for t in flood:
            t.start()
        time.sleep(flood_s)
        stop.set()
        for t in [c, *flood]:
            t.join(timeout=60)
        flood_channel.close()
        stop.clear()
        after = threading.Thread(target=calm_client, args=("after",), daemon=True)
        after.start()
        time.sleep(1.0)
        stop.set()
        after.join(timeout=30)
        checked, mism = recheck(book, srv.target)
        assert not mism
        c2, mism2 = recheck(calm, srv.target)
        assert not mism2
        assert_answers_are_the_keys(book, bundle)
        assert_answers_are_the_keys(calm, bundle)
        alive = srv.alive()
    finally:
        srv.terminate()
    assert alive
    flood_codes = {k: v for k, v in book.codes.items() if k != "OK"}
    assert set(flood_codes) <= {"RESOURCE_EXHAUSTED"}, f"flood saw {flood_codes}"
    assert flood_codes.get("RESOURCE_EXHAUSTED", 0) > 0, "32 > 4 in flight never refused?"
    calm_errors = {k: v for k, v in calm.codes.items() if k != "OK"}
    assert not calm_errors, f"in-limit client was affected by the flood: {calm_errors}"
    calm_calls = sum(calm.codes.values())
    report(
        "overload",
        max_in_flight=bound,
        flood_clients=32,
        flood_s=flood_s,
        flood_ok=book.codes.get("OK", 0),
        flood_resource_exhausted=flood_codes.get("RESOURCE_EXHAUSTED", 0),
        in_limit_calls=calm_calls,
        in_limit_refused_during_flood=calm.codes.get("flood:RESOURCE_EXHAUSTED", 0),
        answers_rechecked=checked + c2,
        unexpected_errors={},
    )
