"""Channel construction shared by the sync and asyncio clients (qveil.client.channel): the
retry policy's checks and its gRPC service config, the channel options, the bearer token's
metadata, one deadline for a whole call, and token files (each bad one refused naming it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from cli_helpers import bad_token_files

from qveil.client.channel import (
    MAX_ATTEMPTS,
    MAX_MESSAGE_BYTES,
    RETRY_EXEMPT,
    Connection,
    RetryPolicy,
    TLSConfig,
    auth_metadata,
    channel_credentials,
    channel_options,
    read_token_file,
)
from qveil.errors import InvalidArgument


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"attempts": 0}, r"retry attempts 0 must be in \[1, 5\]"),
        ({"attempts": MAX_ATTEMPTS + 1}, "must be in"),
        ({"attempts": True}, "retry attempts True"),
        ({"initial_backoff": 0}, "retry initial_backoff 0 must be > 0"),
        ({"max_backoff": float("inf")}, "retry max_backoff inf must be > 0"),
        ({"backoff_multiplier": "2"}, "retry backoff_multiplier '2'"),
        ({"codes": ("OK",)}, "names of non-OK status codes"),
        ({"codes": ("NOT_A_CODE",)}, "names of non-OK status codes"),
        ({"codes": ()}, "names of non-OK status codes"),
    ],
)
def test_retry_policy_refuses_bad_values(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        RetryPolicy(**kw)  # type: ignore[arg-type]


def test_the_service_config_retries_every_service_but_the_state_changing_calls() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff=0.1, max_backoff=1.5)
    retried, exempt = policy.service_config()["methodConfig"]
    assert retried["retryPolicy"] == {
        "maxAttempts": 3,
        "initialBackoff": "0.100000s",
        "maxBackoff": "1.500000s",
        "backoffMultiplier": 2.0,
        "retryableStatusCodes": ["RESOURCE_EXHAUSTED", "UNAVAILABLE"],
    }
    assert {"service": "qveil.v1.ValueService"} in retried["name"]
    assert exempt == {"name": [{"service": s, "method": m} for s, m in RETRY_EXEMPT]}
    assert "retryPolicy" not in exempt
    args = dict(policy.channel_args())
    assert args["grpc.enable_retries"] == 1
    assert json.loads(str(args["grpc.service_config"])) == policy.service_config()
    assert RetryPolicy(attempts=1).channel_args() == [("grpc.enable_retries", 0)]


def test_the_sdk_own_wait_is_jittered_and_bounded() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=0.3)
    for attempt in range(6):
        for _ in range(50):
            assert 0.0 <= policy.delay(attempt) <= min(0.3, 0.1 * 2**attempt)


def test_channel_options_and_credentials() -> None:
    opts = dict(channel_options(None))
    assert opts["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES
    assert opts["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES
    assert opts["grpc.enable_retries"] == 1 and "grpc.ssl_target_name_override" not in opts
    named = dict(channel_options(TLSConfig(server_name="qveil.test"), RetryPolicy(attempts=1)))
    assert named["grpc.ssl_target_name_override"] == "qveil.test"
    assert named["grpc.enable_retries"] == 0
    assert channel_credentials(None) is None and channel_credentials(False) is None
    assert isinstance(channel_credentials(True), grpc.ChannelCredentials)


def test_auth_metadata() -> None:
    assert auth_metadata("abc") == (("authorization", "Bearer abc"),)
    assert auth_metadata(None) == () and auth_metadata("") == ()


def test_a_connection_has_one_deadline_for_a_whole_call() -> None:
    conn = Connection.of("127.0.0.1:1", token="t", tls=None, timeout=10.0, retry=None)
    assert conn.metadata == (("authorization", "Bearer t"),) and conn.credentials is None
    assert conn.retry == RetryPolicy() and conn.attempts() == MAX_ATTEMPTS
    assert conn.attempts(idempotent=False) == 1
    now = time.monotonic()
    deadline = conn.deadline(None)  # the client's timeout
    assert deadline is not None and now + 9.0 < deadline <= time.monotonic() + 10.0
    short = conn.deadline(0.5)
    assert short is not None and short < deadline
    assert Connection.left(None) is None
    assert Connection.left(time.monotonic() - 5.0) == 0.001  # past: at least 1 ms
    left = Connection.left(time.monotonic() + 3.0)
    assert left is not None and 2.0 < left <= 3.0
    none = Connection.of("127.0.0.1:1", token=None, tls=None, timeout=None, retry=None)
    assert none.deadline(None) is None and none.metadata == ()


def test_read_token_file(tmp_path: Path) -> None:
    good = tmp_path / "tok"
    good.write_text("  s3cret-token\n")
    assert read_token_file(good) == "s3cret-token"
    for path, words in bad_token_files(tmp_path):
        with pytest.raises(InvalidArgument) as exc:
            read_token_file(path)
        assert str(exc.value).startswith("token file ")
        assert all(w in str(exc.value) for w in words), (words, str(exc.value))
