"""Channel construction shared by the sync and asyncio clients: TLS / mutual TLS, the bearer
token, message-size limits and the retry policy (a gRPC service config that honours the
server's retry pushback)."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from qveil.common.errors import is_server_reset
from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject

__all__ = [
    "RETRY_EXEMPT",
    "Connection",
    "RetryPolicy",
    "TLSConfig",
    "auth_metadata",
    "channel_credentials",
    "channel_options",
]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: a request up to this size is kept for a retry (gRPC's default is 256 KiB, less than a full
#: batch of 4096 states of 8 coordinates); a larger one is sent once
RETRY_BUFFER_BYTES = 16 * 1024 * 1024
#: the services whose calls the policy retries: every call of them is idempotent (a query
#: answers the same values again; reads do not change anything) except RETRY_EXEMPT
RETRIED_SERVICES = (
    "qveil.v1.ValueService",
    "qveil.v1.AuditService",
    "qveil.v1.AdminService",
    "inference.GRPCInferenceService",
)
#: calls that change the server's state: never retried by the channel
RETRY_EXEMPT = (
    ("qveil.v1.AdminService", "ActivateRelease"),
    ("qveil.v1.AdminService", "RetireRelease"),
)
#: gRPC caps maxAttempts at 5 (gRFC A6); a larger value would be lowered silently
MAX_ATTEMPTS = 5
_CODES = frozenset(c.name for c in grpc.StatusCode if c is not grpc.StatusCode.OK)


def _read(v: str | bytes | Path | None) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v
    return Path(v).read_bytes()


def _seconds(x: float) -> str:
    return f"{x:.6f}s"  # a protobuf Duration in JSON


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS settings of a client. ``ca``: PEM (bytes) or a path to the CA that signed the server
    certificate (None: the system roots). ``cert``/``key``: the client certificate and key for
    mutual TLS. ``server_name``: override of the name checked against the certificate."""

    ca: str | bytes | Path | None = None
    cert: str | bytes | Path | None = None
    key: str | bytes | Path | None = None
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the SDK's channel retries a call the server refused for now: gRPC's own retry
    policy (gRFC A6), shipped as the channel's default service config.

    * ``codes``: the retried status codes, RESOURCE_EXHAUSTED (a quota or a concurrency
      bound) and UNAVAILABLE (the server starting, draining, or its store down) by default.
    * The server's pushback (trailer ``grpc-retry-pushback-ms``) decides the wait when it
      sends one: a caller over its state budget waits exactly until its request fits,
      and a pushback of -1 (a request larger than the whole budget, a wait
      longer than the call's deadline) ends the retries at once. Without a pushback the
      wait is random in [0, min(``initial_backoff`` x ``backoff_multiplier`` ^ (n - 1),
      ``max_backoff``)] before attempt n + 1.
    * Bounds: ``attempts`` calls in all, the first included (2 to 5; gRPC's ceiling is 5;
      1 turns retries off), and the call's deadline (the client's ``timeout``), which covers
      every attempt and every wait: a call never takes longer than its timeout.

    Calls that change the server's state (ActivateRelease, RetireRelease) are never retried.
    A server that resets a call while shutting down (CANCELLED before any handler ran) is
    retried by the SDK itself, within the same attempts and deadline."""

    attempts: int = MAX_ATTEMPTS
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    backoff_multiplier: float = 2.0
    codes: tuple[str, ...] = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise InvalidArgument(
                f"retry attempts {self.attempts!r} must be in [1, {MAX_ATTEMPTS}] (gRPC's cap)"
            )
        for name in ("initial_backoff", "max_backoff", "backoff_multiplier"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0 < v < 1e6):
                raise InvalidArgument(f"retry {name} {v!r} must be > 0")
        bad = [c for c in self.codes if c not in _CODES]
        if bad or not self.codes:
            raise InvalidArgument(f"retry codes {self.codes!r}: names of non-OK status codes")

    def delay(self, attempt: int) -> float:
        """The SDK's own wait before retrying a call reset by the server (full jitter)."""
        return random.uniform(0, min(self.max_backoff, self.initial_backoff * 2**attempt))

    def service_config(self) -> JSONObject:
        """The gRPC service config of this policy (``grpc.service_config`` channel option);
        any gRPC client can use it, e.g. tritonclient.grpc through ``channel_args``."""
        retry = {
            "maxAttempts": self.attempts,
            "initialBackoff": _seconds(self.initial_backoff),
            "maxBackoff": _seconds(self.max_backoff),
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": list(self.codes),
        }
        configs: list[JSONObject] = [
            {"name": [{"service": s} for s in RETRIED_SERVICES], "retryPolicy": retry},
            {"name": [{"service": s, "method": m} for s, m in RETRY_EXEMPT]},
        ]
        return {"methodConfig": configs}

    def channel_args(self) -> list[tuple[str, int | str]]:
        """The channel options that install this policy (retries off for ``attempts`` 1)."""
        if self.attempts < 2:
            return [("grpc.enable_retries", 0)]
        return [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(self.service_config())),
            ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
        ]


def channel_credentials(tls: TLSConfig | bool | None) -> grpc.ChannelCredentials | None:
    """None for plaintext; ``True`` for TLS with the system roots."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca),
        private_key=_read(tls.key),
        certificate_chain=_read(tls.cert),
    )


def channel_options(
    tls: TLSConfig | bool | None, retry: RetryPolicy | None = None
) -> list[tuple[str, object]]:
    """Message limits, the retry policy (default :class:`RetryPolicy`) and TLS overrides."""
    opts: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        *(retry or RetryPolicy()).channel_args(),
    ]
    if isinstance(tls, TLSConfig) and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


@dataclass(frozen=True, slots=True)
class Connection:
    """What every call of one client shares, sync or asyncio: the target, the channel's
    credentials and options, the bearer token's metadata, the default deadline and the
    retry policy."""

    target: str
    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, object]]
    metadata: tuple[tuple[str, str], ...]
    timeout: float | None
    retry: RetryPolicy

    @classmethod
    def of(
        cls,
        target: str,
        *,
        token: str | None,
        tls: TLSConfig | bool | None,
        timeout: float | None,
        retry: RetryPolicy | None,
    ) -> Connection:
        policy = retry or RetryPolicy()
        return cls(
            target=target,
            credentials=channel_credentials(tls),
            options=channel_options(tls, policy),
            metadata=auth_metadata(token),
            timeout=timeout,
            retry=policy,
        )

    def channel(self) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(self.target, options=self.options)
        return grpc.secure_channel(self.target, self.credentials, options=self.options)

    def aio_channel(self) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(self.target, options=self.options)
        return grpc.aio.secure_channel(self.target, self.credentials, options=self.options)

    def attempts(self, idempotent: bool = True) -> int:
        """Calls in all for one request: the policy's attempts, 1 for a non-idempotent call."""
        return self.retry.attempts if idempotent else 1

    def deadline(self, timeout: float | None) -> float | None:
        """The monotonic time one whole call (every attempt and wait) must end by: ``timeout``
        seconds from now, the client's timeout when not given; None: no deadline."""
        total = timeout or self.timeout
        return None if total is None else time.monotonic() + total

    @staticmethod
    def left(deadline: float | None) -> float | None:
        """The seconds an attempt may take (at least 1 ms) before ``deadline``."""
        return None if deadline is None else max(0.001, deadline - time.monotonic())

    def reset_wait(self, exc: grpc.RpcError, attempt: int, attempts: int) -> float | None:
        """The wait before retrying attempt ``attempt`` (from 0) of ``attempts`` that failed
        with ``exc``: a call the server reset while shutting down is retried by the SDK
        itself (the channel's policy retries the rest); None: raise ``exc``."""
        if is_server_reset(exc) and attempt + 1 < attempts:
            return self.retry.delay(attempt)
        return None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def read_token_file(path: str | Path) -> str:
    """A token file holds one token (surrounding whitespace ignored). A file that cannot be
    read, is not UTF-8 or is empty is InvalidArgument naming the file."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidArgument(
            f"token file {echo(str(path))} cannot be read: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise InvalidArgument(f"token file {echo(str(path))} is not UTF-8 text") from None
    if not token:
        raise InvalidArgument(f"token file {echo(str(path))} is empty")
    return token
