"""``qveil admin`` as a command (qveil.server.commands.admin), run in this process: on a store
made by init-store (caps, budgets, the ledger, the log, releases activated, retired, exported
and imported, text and JSON), through a running in-process server's AdminService with
--target, and refusals (exit 2, one line) that create and change nothing (retrain through the
command: test_server_governance_admin.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, qveil_main
from server_helpers import Served
from store_helpers import RID, keyed_paths, log_values, make_release

from qveil.server.commands.admin import _finite
from qveil.server.store import open_store


def _admin(*argv: str) -> str:
    r = qveil_main("admin", *argv)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_init_store_only_creates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QVEIL_STORE_URL", raising=False)
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"
    r = qveil_main("admin", "releases", "--store", url)
    assert_one_line_error(r, "admin", "qveil admin creates a store only with init-store")
    assert not (tmp_path / "new.sqlite").exists()
    assert_one_line_error(qveil_main("admin", "log"), "admin", "admin log needs --store URL")
    made = json.loads(_admin("init-store", "--store", url, "--json"))
    assert made["store"] == url and len(made["store_id"]) == 32
    assert _admin("releases", "--store", url).strip() == "(no releases)"
    assert _admin("budget", "--store", url).strip() == "(no datasets in the ledger)"
    assert _admin("ledger", "--store", url).strip() == "(the ledger is empty)"


def test_caps_budgets_and_the_log(admin_store: str) -> None:
    out = _admin("set-cap", "--store", admin_store, "--dataset-id", "d", "--epsilon", "2",
                 "--delta", "1e-4")  # fmt: skip
    assert out.strip() == "cap of d: eps=2 delta=0.0001"
    assert _admin("budget", "--store", admin_store).startswith(
        "dataset d: spent eps=0 delta=0; cap eps=2 delta=0.0001; remaining eps=2"
    )
    [rep] = json.loads(_admin("budget", "--store", admin_store, "--dataset-id", "d", "--json"))
    assert rep["dataset_id"] == "d" and rep["cap"]["epsilon"] == 2.0
    ledger = _admin("ledger", "--store", admin_store).splitlines()
    assert ledger[0].split()[:3] == ["dataset", "releases", "epsilon"]
    assert ledger[1].split()[:2] == ["d", "0"]
    # the cap is the registry's; the store's log holds the store's operations
    assert _admin("log", "--store", admin_store).strip() == "(empty)"
    r = qveil_main("admin", "set-cap", "--store", admin_store, "--dataset-id", "d",
                   "--epsilon", "-1", "--delta", "1e-4")  # fmt: skip
    assert r.returncode == 2 and "qveil admin: error:" in r.stderr
    assert json.loads(_admin("budget", "--store", admin_store, "--json"))[0]["cap"]["epsilon"] == 2


def test_releases_activated_retired_exported_and_imported(admin_store: str, tmp_path: Path) -> None:
    with open_store(admin_store) as st:
        rec = make_release(st)
        make_release(st, "rel-2")
        log_values(st, keyed_paths(rec), RID, [0, 1], [[0.1, 0.2], [0.3]])
    assert _admin("activate", RID, "--store", admin_store).startswith(f"release {RID} is active")
    table = _admin("releases", "--store", admin_store).splitlines()
    assert table[0].split()[:2] == ["release", "status"]
    assert {ln.split()[0]: ln.split()[1] for ln in table[1:]} == {RID: "active", "rel-2": "staged"}
    r = qveil_main("admin", "retire", RID, "--store", admin_store)
    assert_one_line_error(r, "admin", "is active")
    assert _admin("retire", "rel-2", "--store", admin_store).strip() == "release rel-2 retired"
    log = _admin("log", "--store", admin_store, "--limit", "2").splitlines()
    assert len(log) == 2 and f"retire {RID} -> refused" in log[0]
    assert log[1].endswith("retire rel-2 -> ok")
    out = tmp_path / "rel.jsonl"
    said = _admin("export-release", RID, "--out", str(out), "--store", admin_store)
    assert said.startswith(f"release {RID}: 3 logged points written to {out}")
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    _admin("init-store", "--store", other)
    got = json.loads(_admin("import-release", str(out), "--store", other, "--json"))
    assert (got["release_id"], got["points"]) == (RID, 3)
    with open_store(other) as st, open_store(admin_store) as src:
        assert [(p.x, p.g) for p in st.iter_points(RID, 0)] == [
            (p.x, p.g) for p in src.iter_points(RID, 0)
        ]
    r = qveil_main("admin", "import-release", str(out), "--store", other)
    assert r.returncode == 2 and "already exists" in r.stderr


def test_through_a_running_server(served: Served, tmp_path: Path) -> None:
    tok = tmp_path / "admin.tok"
    tok.write_text(served.tokens.admin + "\n")
    where = ["--target", served.server.target, "--token-file", str(tok)]
    rid = served.server.services.query.holder.current().release_id
    out = _admin("releases", *where)
    assert out.splitlines()[-1] == f"active: {rid}" and rid[:34] in out
    got = json.loads(_admin("releases", *where, "--json"))
    assert got["active_release_id"] == rid and got["releases"][0]["status"] == "active"
    assert "dataset test-users: spent eps=" in _admin("budget", *where)
    r = qveil_main("admin", "retire", rid, *where)
    assert_one_line_error(r, "admin", "is active")
    query_tok = tmp_path / "query.tok"
    query_tok.write_text(served.tokens.query)
    r = qveil_main("admin", "releases", "--target", served.server.target, "--token-file",
                   str(query_tok))  # fmt: skip
    assert r.returncode == 2 and "permission" in r.stderr.lower()
    r = qveil_main("admin", "releases", *where, "--tls-cert", "c.pem")
    assert_one_line_error(r, "admin", "give both --tls-cert and --tls-key")
    assert served.server.services.query.holder.current().release_id == rid


def test_numbers_never_exercised_are_null_not_nan() -> None:
    assert _finite({"a": [math.nan, 1.0, {"b": math.inf}], "c": "x"}) == {
        "a": [None, 1.0, {"b": None}],
        "c": "x",
    }
