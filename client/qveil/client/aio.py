"""asyncio variant of :class:`qveil.client.ValueClient` (grpc.aio), same semantics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Self, TypeVar

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from qveil.client import calls
from qveil.client.calls import StateFields, is_flat, state_fields
from qveil.client.channel import Connection, RetryPolicy, TLSConfig
from qveil.common import typing as t
from qveil.common.errors import from_grpc_error
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = ["AsyncValueClient"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class AsyncValueClient:
    """``async with AsyncValueClient(target) as c: q = await c.values([0.3])``.

    States as for :class:`qveil.client.ValueClient`: a flat list of d numbers on a release
    of d > 1 coordinates is one state (the release's ``dims``, learnt once)."""

    _dims: int | None = None

    async def _state_fields(self, states: npt.ArrayLike) -> StateFields:
        if self._dims is None and is_flat(states):
            self._dims = (await self.release()).dims
        return state_fields(states, self._dims or 1)

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._conn = Connection.of(target, token=token, tls=tls, timeout=timeout, retry=retry)
        self.target = target
        self._channel = self._conn.aio_channel()
        self._stub = value_grpc.ValueServiceStub(self._channel)

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[Message, M],
        request: Message,
        timeout: float | None,
    ) -> M:
        """One call, retried as :meth:`qveil.client.ValueClient._call` does."""
        attempts = self._conn.attempts()
        deadline = self._conn.deadline(timeout)
        for attempt in range(attempts):
            try:
                return await method(
                    request, timeout=self._conn.left(deadline), metadata=self._conn.metadata
                )
            except grpc.aio.AioRpcError as exc:
                wait = self._conn.reset_wait(exc, attempt, attempts)
                if wait is None:
                    raise from_grpc_error(exc) from None
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _run(self, call: calls.Call[M, T], timeout: float | None) -> T:
        resp = await self._call(getattr(self._stub, call.method), call.request, timeout)
        return call.decode(resp)

    async def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        release_id: str = "",
        timeout: float | None = None,
    ) -> t.Values:
        fields = await self._state_fields(states)
        return await self._run(calls.get_values(fields, actions, release_id), timeout)

    async def values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> npt.NDArray[np.float64]:
        return (await self.get_values(states, actions, timeout=timeout)).values

    async def best_actions(
        self, states: npt.ArrayLike, *, timeout: float | None = None
    ) -> npt.NDArray[np.int64]:
        fields = await self._state_fields(states)
        return (await self._run(calls.get_best_actions(fields, ""), timeout)).actions

    async def release(self, *, timeout: float | None = None) -> t.Release:
        return await self._run(calls.get_release(), timeout)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
