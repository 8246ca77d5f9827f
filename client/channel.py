"""Channel construction shared by the sync and asyncio clients: TLS / mutual TLS, the bearer
token, message-size limits and the retry schedule for UNAVAILABLE."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["RetryPolicy", "TLSConfig", "auth_metadata", "channel_credentials", "channel_options"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _read(v: str | bytes | Path | None) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v
    return Path(v).read_bytes()


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
    """Retries of idempotent calls that fail with UNAVAILABLE: exponential backoff with full
    jitter, ``attempts`` calls in all."""

    attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, self.initial_backoff * 2**attempt))


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


def channel_options(tls: TLSConfig | bool | None) -> list[tuple[str, object]]:
    opts: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),  # retries are ours (RetryPolicy), idempotent calls only
    ]
    if isinstance(tls, TLSConfig) and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def read_token_file(path: str | Path) -> str:
    """A token file holds one token (surrounding whitespace ignored)."""
    token = Path(path).read_text().strip()
    if not token:
        from qveil.errors import InvalidArgument

        raise InvalidArgument(f"token file {str(path)!r} is empty")
    return token
