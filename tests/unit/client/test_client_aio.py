"""The asyncio SDK (qveil.client.aio) against a real server (LocalServer: gRPC on 127.0.0.1,
port 0): the same messages as the blocking client, so the same values, best actions and
card; the server's refusals as typed errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from server_helpers import Served, served_values

from qveil.bundle import load_bundle
from qveil.client import AsyncValueClient, InvalidArgumentError, RetryPolicy, UnavailableError

STATES = [-0.5, 0.0, 1.25]


def test_values_best_actions_and_release(served: Served) -> None:
    async def ask() -> tuple[np.ndarray, np.ndarray, np.ndarray, str, list[np.ndarray]]:
        async with AsyncValueClient(served.target, token=served.tokens.query) as c:
            q = await c.values(STATES)
            sub = await c.values(STATES, [1])
            best = await c.best_actions(STATES)
            release = await c.release()
            # calls in flight together on one channel
            many = await asyncio.gather(*(c.values([s]) for s in STATES))
            return q, sub, best, release.release_id, list(many)

    q, sub, best, release_id, many = asyncio.run(ask())
    want = served_values(served.bundle, STATES)
    np.testing.assert_array_equal(q, want)
    np.testing.assert_array_equal(sub, want[:, [1]])
    np.testing.assert_array_equal(best, np.argmax(want, axis=1))
    np.testing.assert_array_equal(np.vstack(many), want)
    assert release_id == load_bundle(served.bundle).bundle_id


def test_errors_are_typed(served: Served) -> None:
    async def bad_state() -> None:
        async with AsyncValueClient(served.target, token=served.tokens.query) as c:
            await c.values([float("inf")])

    with pytest.raises(InvalidArgumentError):
        asyncio.run(bad_state())

    async def nobody() -> None:
        async with AsyncValueClient("127.0.0.1:9", retry=RetryPolicy(attempts=1), timeout=5) as c:
            await c.release()

    with pytest.raises(UnavailableError):
        asyncio.run(nobody())
