"""``qveil audit``: passes on a healthy store; fails on an edited value, a deleted row,
a reordered sequence, a truncated store (high-water mark against the audit log) and on paths
logged with noise of the wrong sigma or beta. With ``--bundle`` every logged value is
recomputed from the release's key: the audit passes on a log a real server wrote, and fails,
naming the mismatch, on a value edited with its chain recomputed (which nothing else sees)
and on the log of one release audited against another release's bundle.

Real SQLite files. The store only logs what was answered (``record_paths``); the values a test
logs are a real release's noise (:class:`qveil.keyed.KeyedPaths` under seeded keys), so the
audit sees exactly what a server would have logged. Wrong-law paths are logged under a record
that claims other parameters (sigma or beta) than the key's paths have. What a wrong
implementation would score is in each assertion's comment: at n = 400 per action, sigma x 1.3
gives var ~ 1.69 and var_p ~ 1e-25; the variance test alone has power 0.99995 at the audit's
pass level. The keys are seeded, so every verdict here is fixed (no false-alarm rate).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from server_helpers import make_bundle
from store_helpers import make_release

from qveil.bundle import load_bundle
from qveil.cli import main
from qveil.client.sync import ValueClient
from qveil.keyed import KeyedPaths, seeded_key, snap
from qveil.server.governance.admin_db import admin_db_for
from qveil.server.governance.audit import audit_store, variance_test_power
from qveil.server.local import LocalServer
from qveil.server.store import open_store
from qveil.server.store.integrity import ChainHasher

SIGMA, BETA, N = 0.5, 3.0, 400


def fill(
    store,
    rid: str,
    *,
    sigma: float = SIGMA,
    beta: float = BETA,
    n: int = N,
    seed: int = 0,
    actions: int = 2,
    true: dict[str, float] | None = None,
) -> KeyedPaths:
    """Register a release (sigma, beta) and log the keyed values of n random states per
    action (key seeded by ``seed``), in batches, as a server's answer log does. ``true``:
    the key's paths have these parameters instead of the record's (a wrong law)."""
    store.releases.create_release(
        release_id=rid,
        fingerprint=f"fp-{rid}",
        sigma=sigma,
        beta=beta,
        interval=(-1.0, 1.0),
        n_actions=actions,
    )
    law = {"sigma": sigma, "beta": beta, **(true or {})}
    paths = KeyedPaths(
        key=seeded_key(seed), betas=[law["beta"]], sigma=law["sigma"], n_actions=actions
    )
    rng = np.random.default_rng(seed)
    for a in range(actions):
        for chunk in np.array_split(rng.random(n), 8):  # several transactions, like real traffic
            log(store, paths, rid, a, chunk)
    return paths


def log(store, paths: KeyedPaths, rid: str, path: int, units: np.ndarray) -> None:
    """Log path ``path``'s keyed values at the unit states ``units`` (snapped to the grid)."""
    idx, xs = snap(np.asarray(units, dtype=np.float64))
    store.record_paths(rid, [path], [xs], [paths.path_values(path, idx)])


@pytest.fixture
def healthy(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url) as st:
        fill(st, "rel-a", seed=1)
        fill(st, "rel-b", seed=2, sigma=2.0, beta=40.0)
        make_release(st, "rel-empty", n_actions=1, sigma=1.0, beta=1.0, interval=(0.0, 1.0))
    return url


def run_audit(url: str, *extra: str) -> tuple[int, dict]:
    out = Path(url.removeprefix("sqlite:///")).with_name(f"report-{len(extra)}.json")
    code = main(["audit", "--store", url, "--export", str(out), *extra])
    return code, json.loads(out.read_text())


def _sql(url: str, *statements: str) -> None:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        for s in statements:
            assert conn.execute(s).rowcount >= 1, s
        conn.commit()
    finally:
        conn.close()


def test_healthy_store_passes_with_power_plot_and_export(
    healthy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "noise.png"
    code, rep = run_audit(healthy, "--plot", str(png))
    assert code == 0, rep["failures"]
    assert rep["passed"] and rep["failures"] == []
    assert rep["pass_level"]["per_path_level"] == pytest.approx(1e-3 / 4)  # 4 paths tested
    tested = [a for r in rep["releases"] for a in r["actions"] if a["tested"]]
    assert len(tested) == 4
    for a in tested:
        assert a["stats"]["n"] == N and a["stats"]["passed"]
        assert a["integrity_ok"] and a["high_water_mark"] == N
        # power: the same path as if its noise had sigma x 1.3 is rejected
        assert a["power"]["rescaled_rejected"], a["power"]
        assert a["power"]["variance_test_power"] > 0.999
    empty = next(r for r in rep["releases"] if r["release_id"] == "rel-empty")
    assert empty["passed"] and "fewer than" in empty["actions"][0]["stats"]["skipped"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report never carries a noise value
    with open_store(healthy) as st:
        gs = [p.g for p in st.iter_points("rel-a", 0)]
    text = json.dumps(rep)
    assert not any(repr(g) in text for g in gs[:50])
    assert "PASSED" in capsys.readouterr().out


def test_audit_service_report_equals_cli_report(healthy: str) -> None:
    """The same function makes both; only timestamps differ."""
    with open_store(healthy) as st:
        db = admin_db_for(st, healthy)
        r1 = audit_store(st, db, record=False, store_label=healthy).to_dict()
        r2 = audit_store(st, db, record=False, store_label=healthy).to_dict()
        db.close()
    r1.pop("generated_at")
    r2.pop("generated_at")
    assert r1 == r2


@pytest.mark.parametrize(
    "statements, finding",
    [
        (
            [
                "UPDATE noise_points SET g = g + 1e-9 WHERE release_id = 'rel-a' AND action = 0 "
                "AND seq = 100"
            ],
            "hash chain broken at seq 100",
        ),
        (
            ["DELETE FROM noise_points WHERE release_id = 'rel-a' AND action = 1 AND seq = 200"],
            "sequence gap",
        ),
        (
            [
                "UPDATE noise_points SET seq = -1 "
                "WHERE release_id = 'rel-b' AND action = 0 AND seq = 50",
                "UPDATE noise_points SET seq = 50 "
                "WHERE release_id = 'rel-b' AND action = 0 AND seq = 51",
                "UPDATE noise_points SET seq = 51 "
                "WHERE release_id = 'rel-b' AND action = 0 AND seq = -1",
            ],
            "hash chain broken at seq 50",
        ),
    ],
    ids=["edited-value", "deleted-row", "reordered"],
)
def test_tampered_store_fails(healthy: str, statements: list[str], finding: str) -> None:
    _sql(healthy, *statements)
    code, rep = run_audit(healthy)
    assert code == 1
    assert not rep["passed"]
    assert any(finding in f for f in rep["failures"]), rep["failures"]


def test_state_stored_twice_with_a_valid_link_fails(healthy: str) -> None:
    """The append log has no unique x (migration 0005): a second row for a stored state,
    written behind the store's back with the next seq and a valid chain link, is reported by
    the audit (the store's verification and the audit's own duplicate check), and the path is
    not tested statistically."""
    with open_store(healthy) as st:
        pts = list(st.iter_points("rel-a", 1))
    last, again = pts[-1], pts[41]
    seq = last.seq + 1
    h = ChainHasher().link(bytes.fromhex(last.hash), seq, again.x, 0.0).hex()
    _sql(
        healthy,
        "INSERT INTO noise_points (release_id, action, coordinate, seq, x, g, created_at, hash) "
        f"VALUES ('rel-a', 1, 0, {seq}, {again.x!r}, 0.0, 0.0, '{h}')",
    )
    code, rep = run_audit(healthy)
    assert code == 1 and not rep["passed"]
    want = f"seq {seq}: state {again.x!r} stored twice (first at seq {again.seq})"
    assert any(want in f for f in rep["failures"]), rep["failures"]
    assert any("a state appears twice" in f for f in rep["failures"]), rep["failures"]
    assert not any("hash chain broken" in f for f in rep["failures"]), rep["failures"]
    bad = next(r for r in rep["releases"] if r["release_id"] == "rel-a")["actions"][1]
    assert not bad["tested"] and "integrity failure" in bad["stats"]["skipped"]


def test_truncation_is_caught_by_the_high_water_mark_in_the_audit_log(healthy: str) -> None:
    code, _ = run_audit(healthy)  # records each path's high-water mark and head hash
    assert code == 0
    # delete the newest rows: the remaining chain is intact, counts agree, no gap shows
    _sql(
        healthy, "DELETE FROM noise_points WHERE release_id = 'rel-a' AND action = 0 AND seq > 390"
    )
    with open_store(healthy) as st:
        assert st.verify("rel-a").ok  # the store's own check cannot see it
    code, rep = run_audit(healthy, "--no-record")
    assert code == 1
    assert any("high-water mark 390 is below 400" in f for f in rep["failures"]), rep["failures"]


def test_whole_store_restore_from_an_older_copy_is_caught_only_against_an_outside_report(
    healthy: str, tmp_path: Path
) -> None:
    """A restore of the whole database rolls the in-store audit log back with the points, so
    the in-store marks see nothing; a passing report exported earlier and kept outside the
    store (``--against``) catches it. Without the outside report the old copy passes."""
    old_copy = tmp_path / "old.sqlite"
    src = sqlite3.connect(healthy.removeprefix("sqlite:///"))
    dst = sqlite3.connect(old_copy)
    src.backup(dst)  # the online backup API: a consistent copy
    src.close()
    dst.close()
    with open_store(healthy) as st:  # the live store moves on
        paths = KeyedPaths(key=seeded_key(1), betas=[BETA], sigma=SIGMA, n_actions=2)
        log(st, paths, "rel-a", 0, np.random.default_rng(4).random(50))
    kept_outside = tmp_path / "kept-outside.json"
    assert main(["audit", "--store", healthy, "--export", str(kept_outside)]) == 0
    old_url = f"sqlite:///{old_copy}"
    code, rep = run_audit(old_url, "--no-record")
    assert code == 0, "the in-store marks rolled back with the copy: expected to pass alone"
    code, rep = run_audit(old_url, "--no-record", "--against", str(kept_outside))
    assert code == 1
    assert any(f"high-water mark {N} is below {N + 50}" in f for f in rep["failures"]), rep
    # a report that did not pass cannot anchor; a non-report is refused clearly
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    assert main(["audit", "--store", old_url, "--no-record", "--against", str(bad)]) == 2


def test_rewritten_tail_is_caught_by_the_recorded_head_hash(healthy: str) -> None:
    """Someone replaces the newest row and recomputes its link: chain valid, hash differs."""
    code, _ = run_audit(healthy)
    assert code == 0
    with open_store(healthy) as st:
        pts = list(st.iter_points("rel-a", 1))
    prev = bytes.fromhex(pts[-2].hash)
    forged_g = pts[-1].g + 0.25
    forged = ChainHasher().link(prev, pts[-1].seq, pts[-1].x, forged_g).hex()
    _sql(
        healthy,
        f"UPDATE noise_points SET g = {forged_g!r}, hash = '{forged}' WHERE "
        f"release_id = 'rel-a' AND action = 1 AND seq = {pts[-1].seq}",
    )
    with open_store(healthy) as st:
        assert st.verify("rel-a").ok
    code, rep = run_audit(healthy, "--no-record")
    assert code == 1
    assert any(f"row at seq {N} differs" in f for f in rep["failures"]), rep["failures"]


@pytest.mark.parametrize(
    "claimed, true, reason",
    [
        ({"sigma": SIGMA}, {"sigma": 1.3 * SIGMA}, "sigma x 1.3: var ~ 1.69"),
        ({"sigma": SIGMA}, {"sigma": 0.7 * SIGMA}, "sigma x 0.7: var ~ 0.49"),
        ({"beta": BETA}, {"beta": 4.0 * BETA}, "beta x 4: innovations var ~ 4 at small spacing"),
        ({"beta": BETA}, {"beta": BETA / 4.0}, "beta / 4: innovations var ~ 1/4"),
    ],
    ids=["sigma-x1.3", "sigma-x0.7", "beta-x4", "beta-div4"],
)
def test_wrong_law_fails_the_statistical_test(
    healthy: str, tmp_path: Path, claimed: dict, true: dict, reason: str
) -> None:
    with open_store(healthy) as st:
        fill(st, "rel-wrong", seed=5, **claimed, true=true)
    code, rep = run_audit(healthy)
    assert code == 1, reason
    wrong = next(r for r in rep["releases"] if r["release_id"] == "rel-wrong")
    assert wrong["integrity_ok"]  # every row and link is intact: only the law is wrong
    for a in wrong["actions"]:
        assert not a["stats"]["passed"], (reason, a["stats"])
        assert a["stats"]["var_p"] < 1e-10, (reason, a["stats"])
    others = [r for r in rep["releases"] if r["release_id"] != "rel-wrong"]
    assert all(r["passed"] for r in others)


def test_variance_test_power_matches_simulation() -> None:
    """The exact power in the report agrees with a simulation of normality_report's variance
    test (var_p = 2 min(F, 1 - F) of sum z^2 under chi2_n) on 20000 draws of N(0, 1.69)."""
    from scipy import stats as sps

    from qveil.stats import normality_report

    rng = np.random.default_rng(7)
    n, level = 100, 1e-3
    z = 1.3 * rng.standard_normal((20000, n))
    ss = np.einsum("ij,ij->i", z, z)
    var_p = np.minimum(1.0, 2.0 * np.minimum(sps.chi2.cdf(ss, n), sps.chi2.sf(ss, n)))
    # the same p-value normality_report computes, on a few rows
    for row in z[:3]:
        assert normality_report(row, level=level)["var_p"] == pytest.approx(
            float(np.minimum(1.0, 2.0 * min(sps.chi2.cdf(row @ row, n), sps.chi2.sf(row @ row, n))))
        )
    assert float(np.mean(var_p < level)) == pytest.approx(
        variance_test_power(n, factor=1.3, level=level), abs=0.01
    )


@pytest.mark.postgres
def test_audit_on_postgresql(pg_url: str) -> None:
    """Same audit on the PostgreSQL backend: passes, then fails on an edited value."""
    import psycopg

    with open_store(pg_url) as st:
        fill(st, "rel-pg", n=200, seed=4)
        db = admin_db_for(st, pg_url)
        rep = audit_store(st, db, store_label="pg")
        assert rep.passed, rep.failures()
        db.close()
    with psycopg.connect(
        pg_url.replace("postgresql+psycopg", "postgresql"), autocommit=True
    ) as conn:
        conn.execute("UPDATE noise_points SET g = g * 1.0001 WHERE action = 1 AND seq = 7")
    with open_store(pg_url) as st:
        db = admin_db_for(st, pg_url)
        rep = audit_store(st, db, store_label="pg")
        db.close()
    assert not rep.passed
    assert any("hash chain broken at seq 7" in f for f in rep.failures()), rep.failures()


# ------------------------------------------------------------------------------ --bundle
def _served_log(tmp: Path, bundle: Path, n: int = 300) -> str:
    """A real server (LocalServer: gRPC over loopback) answers ``n`` random states of
    ``bundle``; its answer log is flushed to the SQLite store it returns."""
    url = f"sqlite:///{tmp / 'served.sqlite'}"
    states = np.random.default_rng(8).uniform(-1.0, 2.0, n)  # make_bundle's interval
    with LocalServer(bundle, url) as srv, ValueClient(srv.target) as c:
        c.values(states)
    return url


def _rechain_after_edit(url: str, rid: str, path: int, seq: int, dg: float) -> None:
    """Add ``dg`` to the value at ``seq`` of one path and recompute every later link of its
    chain, as someone with write access to an unkeyed store can: the chain stays valid."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        rows = conn.execute(
            "SELECT seq, x, g, hash FROM noise_points WHERE release_id = ? AND action = ? "
            "ORDER BY seq",
            (rid, path),
        ).fetchall()
        hasher = ChainHasher()
        prev = hasher.genesis(rid, path)
        for s, x, g, h in rows:
            if s == seq:
                g = g + dg
            if s >= seq:
                link = hasher.link(prev, s, x, g).hex()
                conn.execute(
                    "UPDATE noise_points SET g = ?, hash = ? WHERE release_id = ? AND "
                    "action = ? AND seq = ?",
                    (g, link, rid, path, s),
                )
                h = link
            prev = bytes.fromhex(h)
        conn.commit()
    finally:
        conn.close()


def test_bundle_recomputes_every_value_a_server_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = make_bundle(tmp_path / "b", seed=31)
    rid = load_bundle(b).bundle_id
    url = _served_log(tmp_path, b)
    code, rep = run_audit(url, "--bundle", str(b), "--no-record")
    assert code == 0, rep["failures"]
    [r] = rep["releases"]
    assert r["release_id"] == rid and r["key_checked"] and r["passed"]
    assert [a["key_checked"] for a in r["actions"]] == [True] * 3
    assert all(a["count"] == 300 and a["tested"] for a in r["actions"])
    out = capsys.readouterr().out
    assert "every logged value recomputed from its key" in out, out
    # without the bundle the same audit passes, and says the values were not recomputed
    code, rep = run_audit(url, "--no-record")
    assert code == 0 and not rep["releases"][0]["key_checked"]
    assert "values not recomputed (give its --bundle)" in capsys.readouterr().out


def test_bundle_catches_an_edited_value_with_its_chain_recomputed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A logged value moved by one value-grid step, every later link recomputed: the store's
    chain, the sequence and the statistics see nothing; the key does, and names it."""
    b = make_bundle(tmp_path / "b", seed=32)
    rid = load_bundle(b).bundle_id
    url = _served_log(tmp_path, b)
    _rechain_after_edit(url, rid, 1, 120, 2.0**-20)
    with open_store(url, create=False) as st:
        assert st.verify(rid).ok  # the store's own check cannot see it
    code, rep = run_audit(url, "--no-record")
    assert code == 0, rep["failures"]  # nor can an audit without the key
    code, rep = run_audit(url, "--bundle", str(b), "--no-record")
    assert code == 1 and not rep["passed"]
    want = (
        f"release {rid} action 1: 1 logged value(s) differ from the release's noise "
        "recomputed from its key"
    )
    [failure] = rep["failures"]  # only the key's finding
    assert failure.startswith(want) and "or edited" in failure, failure
    assert "FAIL: " + want in capsys.readouterr().out


def test_bundle_of_another_release_fails_the_audit(tmp_path: Path) -> None:
    """The log of release A audited against a bundle that claims A's release id but holds
    another key (and model): every logged value differs, on every path. A bundle of a
    release the log does not hold at all fails the audit too."""
    a = make_bundle(tmp_path / "a", seed=33)
    rid = load_bundle(a).bundle_id
    url = _served_log(tmp_path, a, n=40)
    impostor = make_bundle(tmp_path / "imp", seed=34, bundle_id=rid)
    assert load_bundle(impostor).noise_key != load_bundle(a).noise_key
    code, rep = run_audit(url, "--bundle", str(impostor), "--no-record")
    assert code == 1
    for path in range(3):
        want = (
            f"release {rid} action {path}: 40 logged value(s) differ from the release's "
            "noise recomputed from its key"
        )
        assert any(f.startswith(want) for f in rep["failures"]), rep["failures"]
    code, rep = run_audit(url, "--bundle", str(a), "--no-record")
    assert code == 0, rep["failures"]
    # a bundle of a release the log does not hold: nothing can be recomputed, and the audit
    # says so instead of passing
    other = make_bundle(tmp_path / "other", seed=35)
    code, rep = run_audit(url, "--bundle", str(other), "--no-record")
    assert code == 1 and not rep["releases"][0]["key_checked"]
    want = f"a bundle of release {load_bundle(other).bundle_id} was given (--bundle), but"
    assert any(f.startswith(want) for f in rep["failures"]), rep["failures"]
