"""asyncio variant of :class:`qveil.client.ValueClient` (grpc.aio), same semantics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Self

import grpc
import numpy as np
import numpy.typing as npt

from qveil.client.channel import (
    RetryPolicy,
    TLSConfig,
    auth_metadata,
    channel_credentials,
    channel_options,
)
from qveil.client.sync import is_flat, state_fields
from qveil.common import serde as convert
from qveil.common import typing as t
from qveil.common.errors import from_grpc_error, is_server_reset
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = ["AsyncValueClient"]


class AsyncValueClient:
    """``async with AsyncValueClient(target) as c: q = await c.values([0.3])``.

    States as for :class:`qveil.client.ValueClient`: a flat list of d numbers on a release
    of d > 1 coordinates is one state (the release's ``dims``, learnt once)."""

    _dims: int | None = None

    async def _state_fields(self, states: npt.ArrayLike) -> dict[str, Any]:
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
        self._retry = retry or RetryPolicy()
        creds = channel_credentials(tls)
        opts = channel_options(tls, self._retry)
        self.target = target
        self._channel = (
            grpc.aio.secure_channel(target, creds, options=opts)
            if creds is not None
            else grpc.aio.insecure_channel(target, options=opts)
        )
        self._stub = value_grpc.ValueServiceStub(self._channel)
        self._metadata = auth_metadata(token)
        self._timeout = timeout

    async def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        total = timeout or self._timeout
        deadline = None if total is None else time.monotonic() + total
        for attempt in range(self._retry.attempts):
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return await method(request, timeout=left, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if is_server_reset(exc) and attempt + 1 < self._retry.attempts:
                    await asyncio.sleep(self._retry.delay(attempt))
                    continue
                raise from_grpc_error(exc) from None
        raise AssertionError("unreachable")

    async def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        release_id: str = "",
        timeout: float | None = None,
    ) -> t.Values:
        req = value_pb.GetValuesRequest(
            **(await self._state_fields(states)), actions=list(actions or ()), release_id=release_id
        )
        return convert.values_from_proto(await self._call(self._stub.GetValues, req, timeout))

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
        req = value_pb.GetBestActionsRequest(**(await self._state_fields(states)))
        resp = await self._call(self._stub.GetBestActions, req, timeout)
        return convert.best_actions_from_proto(resp).actions

    async def release(self, *, timeout: float | None = None) -> t.Release:
        resp = await self._call(self._stub.GetRelease, value_pb.GetReleaseRequest(), timeout)
        return convert.release_from_proto(resp.release)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
