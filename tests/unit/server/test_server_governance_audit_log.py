"""The admin audit log refuses parameters that must never be logged (tokens, noise values,
passwords) and an unknown outcome, appending nothing. Its tamper detection is tested with the
ledger's, in test_server_governance_ledger.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.errors import InvalidArgument
from qveil.server.governance import audit_log
from qveil.server.governance.admin import open_admin


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


def test_audit_log_never_takes_tokens_or_noise(store_url: str) -> None:
    with open_admin(store_url, actor="a") as ctx:
        for params in (
            {"token": "s3cr3t"},
            {"Authorization_Token": "x"},
            {"detail": {"g": 0.1}},
            {"noise_values": [0.1, 0.2]},
            {"values": [1.0]},
            {"password": "x"},
        ):
            with pytest.raises(InvalidArgument, match="never logged"):
                audit_log.append(ctx.db, actor="a", action="x", outcome="ok", params=params)
        assert audit_log.entries(ctx.db) == []
        with pytest.raises(InvalidArgument):
            audit_log.append(ctx.db, actor="a", action="x", outcome="maybe")
