"""Input and operator errors, with real processes and real stores: admin
commands never create a store, user input is echoed at most 80 characters, the tokens file is
written by a TOML writer, a wrong integrity key has its own message, IPv6 listen addresses are
printed in brackets, and a server certificate is refused as a client certificate under mTLS."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import grpc
import pytest
from cli_helpers import qveil_main
from server_helpers import QVEIL, InProcessServer, make_bundle, make_certs, running

from qveil.client import TLSConfig, ValueClient
from qveil.errors import FailedPrecondition
from qveil.server.serving.auth import add_token, load_tokens
from qveil.server.store import open_store


@pytest.mark.parametrize(
    "op",
    [
        ["releases"],
        ["budget"],
        ["log"],
        ["set-cap", "--dataset-id", "d", "--epsilon", "1", "--delta", "1e-6"],
        ["export-release", "r", "--out", "x.jsonl"],
    ],
)
def test_admin_refuses_a_missing_store_and_creates_nothing(tmp_path: Path, op: list[str]) -> None:
    """Through a real process for the first operation, the same entry point in this process
    for the others."""
    missing = tmp_path / "missing.db"
    argv = ["admin", *op, "--store", f"sqlite:///{missing}"]
    if op == ["releases"]:
        r = subprocess.run([QVEIL, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    else:
        r = qveil_main(*argv, cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert "does not exist" in r.stderr and "init-store" in r.stderr, r.stderr
    assert not missing.exists()
    r = qveil_main("admin", "init-store", "--store", f"sqlite:///{missing}")
    assert r.returncode == 0 and missing.exists(), r.stderr


def test_long_release_id_is_echoed_at_most_80_characters(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=61)
    with InProcessServer(b, f"sqlite:///{tmp_path / 's.sqlite'}") as srv:
        with ValueClient(srv.target) as c:
            with pytest.raises(Exception) as ei:
                c.get_values([0.0], release_id="x" * 5000)
    msg = str(ei.value)
    assert "x" * 81 not in msg and "\u2026" in msg, msg[:300]


def test_token_name_with_quote_and_newline_keeps_the_file_valid(tmp_path: Path) -> None:
    f = tmp_path / "tokens.toml"
    f.write_text("# operators' tokens\n")
    add_token(f, "admin", 'evil"\nrole = "admin')
    add_token(f, "query", "plain")
    data = tomllib.loads(f.read_text())
    assert [t["name"] for t in data["token"]] == ['evil"\nrole = "admin', "plain"]
    assert [e.role for e in load_tokens(f)] == ["admin", "query"]
    assert f.read_text().startswith("# operators' tokens")


def test_wrong_store_key_has_its_own_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    open_store(url, key=b"right").close()
    with open_store(url, key=b"right") as s:
        assert s.releases.list_releases() == []
    for key in (b"wrong", None):
        with pytest.raises(FailedPrecondition, match="integrity key does not match this store"):
            open_store(url, key=key)
    # and through qveil serve (QVEIL_STORE_KEY), not reported as tampering
    b = make_bundle(tmp_path / "b", seed=62)
    r = subprocess.run(
        [QVEIL, "serve", "--bundle", str(b), "--store", url, "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QVEIL_STORE_KEY": "wrong"},
    )
    assert r.returncode != 0
    assert "integrity key does not match this store" in r.stderr, r.stderr
    assert "tamper" not in r.stderr.lower()


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_listen_address_is_printed_in_brackets(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=63)
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [QVEIL, "serve", "--bundle", str(b), "--listen", "[::1]:0", "--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(30)
    assert "listening on [::1]:" in first, first


def test_mtls_refuses_a_server_certificate_as_client_certificate(tmp_path: Path) -> None:
    """The test CA signs both; the server certificate's EKU is serverAuth only, so the server
    refuses it as a client certificate (--tls-client-ca: client certificates from a client CA)."""
    certs = make_certs(tmp_path / "certs")
    b = make_bundle(tmp_path / "b", seed=64)
    tls = certs.mtls_flags()
    hc = certs.client_credentials()
    with running(
        tmp_path, b, *tls, store=f"sqlite:///{tmp_path / 's.sqlite'}", health_creds=hc
    ) as srv:
        good = TLSConfig(
            ca=str(certs.ca),
            cert=str(certs.client_cert),
            key=str(certs.client_key),
            server_name="localhost",
        )
        with ValueClient(srv.target, tls=good) as c:
            assert c.values([0.0]).shape == (1, 3)
        wrong = TLSConfig(
            ca=str(certs.ca),
            cert=str(certs.server_cert),
            key=str(certs.server_key),
            server_name="localhost",
        )
        with ValueClient(srv.target, tls=wrong, timeout=5) as c:
            with pytest.raises(Exception):  # noqa: B017 - handshake refused: UNAVAILABLE
                c.values([0.0])


def test_corrupt_request_body_is_invalid_argument_with_one_log_line(tmp_path: Path) -> None:
    """Raw bytes that are no GetValuesRequest: INVALID_ARGUMENT, one log line, no traceback,
    nothing stored; the server keeps answering."""
    b = make_bundle(tmp_path / "b", seed=65)
    store = f"sqlite:///{tmp_path / 's.sqlite'}"
    with running(tmp_path, b, "--log-level", "WARNING", store=store) as srv:
        with grpc.insecure_channel(srv.target) as ch:
            call = ch.unary_unary("/qveil.v1.ValueService/GetValues")
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as ei:
                    call(b"\xff\xff\xff\xff\x0f", timeout=10)
                assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not a valid message" in (ei.value.details() or "")
        with ValueClient(srv.target) as c:
            assert c.values([0.0]).shape == (1, 3)
        log = srv.output()
    assert log.count("undecodable request body") == 3, log
    assert "Traceback" not in log, log


def test_unexercised_numbers_are_never_printed_as_nan(tmp_path: Path) -> None:
    """A release known only from its store record has no epsilon: tables show "-", JSON null;
    `qveil query --card` prints "n/a" (and strict JSON) for fields a release does not have."""
    import json

    from qveil.client.commands.query import _jsonable
    from qveil.server.commands.admin import _finite, _releases_table

    row = {
        "release_id": "r",
        "status": "staged",
        "sigma": 1.0,
        "beta": 2.0,
        "epsilon": float("nan"),
        "points": 0,
    }
    assert "nan" not in _releases_table([row]).lower()
    assert json.dumps(_finite([row]), allow_nan=False)
    assert _jsonable({"epsilon": float("nan"), "k": float("inf")}) == {"epsilon": None, "k": None}
    b = make_bundle(tmp_path / "b", seed=66)
    with InProcessServer(b, f"sqlite:///{tmp_path / 's.sqlite'}") as srv:
        for extra in ([], ["--json"]):
            r = qveil_main("query", "--target", srv.target, "--card", *extra)
            assert r.returncode == 0, r.stderr
            assert "nan" not in r.stdout.lower(), r.stdout
            if extra:
                json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
