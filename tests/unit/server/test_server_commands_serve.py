"""``qveil serve`` as a command (qveil.server.commands.serve), run in this process: its flags
and defaults as the server's config and limits, every refused combination of flags (exit 2,
one line, nothing created), and --add-token (a running `qveil serve` process:
tests/integration/test_server_e2e.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, qveil_main

from qveil.cli import build_parser
from qveil.server.app import ServeConfig
from qveil.server.commands.flags import call_with_flags
from qveil.server.serving.auth import Authorizer, load_tokens
from qveil.server.serving.limits import Limits
from qveil.server.serving.quotas import DEFAULT_STATE_RATE

pytestmark = pytest.mark.usefixtures("restore_logging")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(["serve"]).parse_args(["serve", *argv])


def test_the_defaults() -> None:
    a = _args("--bundle", "b")
    assert (a.bundle, a.store, a.listen, a.http_port) == (Path("b"), None, "127.0.0.1:50051", None)
    assert (a.max_batch, a.max_in_flight, a.max_in_flight_per_caller) == (4096, 64, None)
    assert (a.state_rate, a.state_burst, a.value_grid) == (DEFAULT_STATE_RATE, None, 2.0**-20)
    assert (a.workers, a.processes, a.grace, a.drain_delay) == (16, 1, 10.0, 0.0)
    assert (a.log_level, a.log_format, a.access_log) == ("WARNING", "text", False)
    assert a.trust_registry_key == [] and a.metrics_host == "127.0.0.1"


def test_flags_reach_the_config_and_the_limits_by_name() -> None:
    a = _args(
        *("--bundle", "b", "--listen", "0.0.0.0:7", "--max-batch", "9", "--grace", "1.5"),
        *("--new-state-rate", "3", "--new-state-burst", "6", "--max-stored-points", "0"),
        *("--trust-registry-key", "aa", "--trust-registry-key", "bb", "--workers", "2"),
    )
    limits = call_with_flags(Limits, a)
    assert (limits.max_batch, limits.state_rate, limits.state_burst) == (9, 3.0, 6.0)
    assert limits.max_stored_points == 0
    config = call_with_flags(ServeConfig, a, store_url=a.store, tls=None, limits=limits)
    assert (config.listen, config.grace, config.workers) == ("0.0.0.0:7", 1.5, 2)
    assert config.trust_registry_key == ["aa", "bb"] and config.limits is limits


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "--bundle DIR is required"),
        (["--bundle", "b", "--processes", "0"], "--processes must be in 1..256, got 0"),
        (["--bundle", "b", "--processes", "257"], "got 257"),
        (["--bundle", "b", "--tls-cert", "c.pem"], "give both --tls-cert and --tls-key"),
        (["--bundle", "b", "--tls-key", "k.pem"], "give both --tls-cert and --tls-key"),
        (["--bundle", "b", "--tls-client-ca", "ca.pem"], "--tls-client-ca (mutual TLS) needs"),
        (["--add-token", "admin"], "--add-token needs --tokens-file"),
        (["--bundle", "b", "--log-level", "LOUD"], "--log-level:"),
        (["--bundle", "b", "--max-batch", "0"], "limits must be positive"),
        (["--bundle", "b", "--value-grid", "0.3"], "value grid 0.3 must be a positive power"),
        (["--bundle", "b", "--state-rate", "-1"], "state rate -1.0 must be > 0"),
        (["--bundle", "b", "--listen", "nowhere"], "must be HOST:PORT"),
        (["--bundle", "b", "--listen", "10.1.2.3:1"], "without TLS"),
    ],
)
def test_refused_flags_exit_2_with_one_line_and_create_nothing(
    tmp_path: Path, argv: list[str], says: str
) -> None:
    r = qveil_main("serve", *argv, cwd=tmp_path)
    assert_one_line_error(r, "serve", says)
    assert list(tmp_path.iterdir()) == []


def test_a_flag_of_the_wrong_type_is_a_usage_error(tmp_path: Path) -> None:
    r = qveil_main("serve", "--bundle", "b", "--max-batch", "many", cwd=tmp_path)
    assert r.returncode == 2 and "invalid int value: 'many'" in r.stderr
    r = qveil_main("serve", "--add-token", "root", "--tokens-file", "t.toml", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'root'" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_add_token_appends_a_hash_and_prints_the_token_once(tmp_path: Path) -> None:
    f = tmp_path / "tokens.toml"
    r = qveil_main("serve", "--add-token", "auditor", "--tokens-file", str(f), "--token-name", "x")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert len(token) >= 32 and token not in f.read_text()
    r2 = qveil_main("serve", "--add-token", "query", "--tokens-file", str(f))
    assert r2.stdout.strip() != token
    tokens = load_tokens(f)
    assert sorted(t.role for t in tokens) == ["auditor", "query"]
    auth = Authorizer(tokens)
    assert auth.authorize("qveil.v1.AuditService", f"Bearer {token}").role == "auditor"
