"""The data plane (qveil.server.protocol.dataplane), called directly on an event loop over a
real query service and SQLite store, no transport: admission (tokens, readiness, drain, the
calls in flight per caller and in all), answers on the loop or in the executor that are the
key's, the request decoded once, and every call observed with its code."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import ModuleRegistry, make_tokens, served_values

from qveil.errors import PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable
from qveil.server.protocol.dataplane import (
    ADMIN,
    INLINE_MAX_STATES,
    VALUE,
    CallContext,
    DataPlane,
    ValuesQuery,
    budget_key,
    new_executor,
)
from qveil.server.serving.auth import Authorizer, load_tokens
from qveil.server.serving.limits import Limits
from qveil.server.serving.services import Services
from qveil.server.store import open_store

PEER = "ipv4:127.0.0.1:5000"


@pytest.fixture
def world(tmp_path: Path, module_registry: ModuleRegistry) -> Iterator[tuple[Services, Path]]:
    """Fresh services on a fresh store (their own metrics) serving the module's bundle."""
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        services = Services.create(
            store=st,
            limits=Limits(max_in_flight=2, max_in_flight_per_caller=1),
            registry=module_registry.registry,
        )
        services.releases.start(module_registry.bundle)
        yield services, module_registry.bundle


def _plane(services: Services, auth: Authorizer | None = None) -> DataPlane:
    return DataPlane(services, auth or Authorizer(None), new_executor(2))


def test_budget_keys_drop_the_port_and_keep_tokens() -> None:
    assert budget_key("peer:ipv4:10.1.2.3:5555") == "peer:ipv4:10.1.2.3"
    assert budget_key("peer:ipv6:[::1]:5555") == budget_key("peer:ipv6:[::1]:6666")
    assert budget_key("token:alice") == "token:alice"


def test_values_on_the_loop_and_in_the_executor_are_the_keys(
    world: tuple[Services, Path],
) -> None:
    services, bundle = world
    plane = _plane(services)
    plane.ready = True
    small = np.linspace(-1, 2, INLINE_MAX_STATES)
    large = np.linspace(-1, 2, INLINE_MAX_STATES + 1)
    decoded: list[int] = []

    def decode(xs: np.ndarray, acts: tuple[int, ...] = ()) -> ValuesQuery:
        decoded.append(1)
        return ValuesQuery(states=xs, actions=acts)

    async def main() -> None:
        ctx = CallContext(peer=PEER)
        a = await plane.get_values(ctx, lambda: decode(small))
        b = await plane.get_values(ctx, lambda: decode(large, (2,)))
        best = await plane.get_best_actions(ctx, lambda: decode(large))
        assert a.values.tobytes() == served_values(bundle, small).tobytes()
        assert b.values.tobytes() == served_values(bundle, large, [2]).tobytes()
        assert best.actions.tolist() == served_values(bundle, large).argmax(1).tolist()
        rel = await plane.get_release(ctx)
        assert rel.release_id == services.ctx.holder.current().release_id
        meta = await plane.server_metadata(ctx)
        assert meta["extensions"] == ["binary_tensor_data"]

    asyncio.run(main())
    plane.executor.shutdown()
    assert decoded == [1, 1, 1]  # each request decoded once, wherever it ran
    assert services.ctx.metrics.requests == {"OK": 5}
    assert plane.in_flight == 0 and plane.by_caller == {}


def test_a_starting_or_draining_server_refuses(world: tuple[Services, Path]) -> None:
    services, _ = world
    plane = _plane(services)
    assert not plane.model_ready("qveil")

    async def main() -> None:
        q = lambda: ValuesQuery(states=np.array([0.0]))  # noqa: E731
        with pytest.raises(Unavailable, match="the server is starting"):
            await plane.get_values(CallContext(peer=PEER), q)
        plane.ready = True
        assert plane.model_ready("qveil") and not plane.model_ready("other")
        plane.closing = True
        with pytest.raises(Unavailable, match="shutting down"):
            await plane.get_values(CallContext(peer=PEER), q)

    asyncio.run(main())
    plane.executor.shutdown()
    assert services.ctx.metrics.requests == {"UNAVAILABLE": 2}
    assert services.ctx.metrics.states_answered == 0


def test_tokens_are_checked_before_anything_runs(
    world: tuple[Services, Path], tmp_path: Path
) -> None:
    services, _ = world
    tokens = make_tokens(tmp_path / "tokens.toml")
    plane = _plane(services, Authorizer(load_tokens(tokens.path)))
    plane.ready = True
    ran: list[str] = []

    async def main() -> None:
        for auth, exc in ((None, Unauthenticated), ("Bearer nope", Unauthenticated)):
            with pytest.raises(exc):
                await plane.call(VALUE, "GetRelease", CallContext(PEER, auth), ran.append)
        with pytest.raises(PermissionDenied):
            await plane.call(
                ADMIN, "Activate", CallContext(PEER, f"Bearer {tokens.query}"), ran.append
            )
        await plane.call(
            VALUE, "GetRelease", CallContext(PEER, f"Bearer {tokens.query}"), ran.append
        )

    asyncio.run(main())
    plane.executor.shutdown()
    assert len(ran) == 1 and ran[0].caller.startswith("token:") and ran[0].role == "query"


def test_calls_in_flight_are_bounded_per_caller_and_in_all(world: tuple[Services, Path]) -> None:
    services, _ = world
    plane = _plane(services)
    plane.ready = True
    gate = threading.Event()

    def hold(_c: object) -> str:
        assert gate.wait(30)
        return "done"

    async def main() -> None:
        first = asyncio.ensure_future(plane.call(VALUE, "M", CallContext("ipv4:1.1.1.1:1"), hold))
        while plane.in_flight < 1:
            await asyncio.sleep(0.001)
        with pytest.raises(ResourceExhausted, match="per-caller bound is 1"):
            await plane.call(VALUE, "M", CallContext("ipv4:1.1.1.1:1"), hold)
        second = asyncio.ensure_future(plane.call(VALUE, "M", CallContext("ipv4:2.2.2.2:1"), hold))
        while plane.in_flight < 2:
            await asyncio.sleep(0.001)
        assert services.ctx.metrics.in_flight == 2
        with pytest.raises(ResourceExhausted, match="2 calls in flight, the bound is 2"):
            await plane.call(VALUE, "M", CallContext("ipv4:3.3.3.3:1"), hold)
        assert not await plane.wait_idle(0.01)
        gate.set()
        assert await first == "done" and await second == "done"
        assert await plane.wait_idle(5)

    asyncio.run(main())
    plane.executor.shutdown()
    assert plane.in_flight == 0 and plane.by_caller == {} and services.ctx.metrics.in_flight == 0
    assert services.ctx.metrics.requests == {"OK": 2, "RESOURCE_EXHAUSTED": 2}
