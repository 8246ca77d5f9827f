"""Tokens and roles: the tokens file holds hashes only; each role may call its services and
no other; a missing or wrong token is refused; without a tokens file only queries are open."""

from __future__ import annotations

import pytest

from qveil import errors as domain


def test_auth_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from qveil.server.serving.auth import Authorizer, add_token, load_tokens

    f = tmp_path / "tokens.toml"
    tok = {r: add_token(f, r) for r in ("query", "admin", "auditor")}
    text = f.read_text()
    assert all(v not in text for v in tok.values())  # hashes only
    auth = Authorizer(load_tokens(f))
    allowed = {
        "qveil.v1.ValueService": {"query", "admin", "auditor"},
        "qveil.v1.AdminService": {"admin"},
        "qveil.v1.AuditService": {"auditor"},
    }
    for service, roles in allowed.items():
        for role, token in tok.items():
            if role in roles:
                assert auth.authorize(service, f"Bearer {token}").role == role
            else:
                with pytest.raises(domain.PermissionDenied):
                    auth.authorize(service, f"Bearer {token}")
        for bad in (None, "", "Bearer", "Basic xyz", f"Bearer {tok['admin']}x"):
            with pytest.raises(domain.Unauthenticated):
                auth.authorize(service, bad)
    anon = Authorizer(None)
    assert anon.authorize("qveil.v1.ValueService", None).role is None
    for service in ("qveil.v1.AdminService", "qveil.v1.AuditService"):
        with pytest.raises(domain.PermissionDenied):
            anon.authorize(service, f"Bearer {tok['admin']}")
