"""The registry (qveil.server.governance.registry): budgets, and an Ed25519 signing key created once
and kept for good, whose receipts ``qveil serve`` trusts. Tried as an operator would: real `qveil
train`, `qveil serve`, `qveil budget` and `qveil audit` processes, real SQLite files and the real
PostgreSQL server. Each command path runs as a real process at least once; the trainings that
only make a release to serve, and the variations of a command, run the same entry point in
this process (cli_helpers.qveil_main); every `qveil serve` is a real process.

A release's answers are a pure function of its weights and its one noise key, so the
registry keeps no record of where the noise lives: a copied bundle, a byte copy of its
store or a database cloned from a template answers exactly as the original. What a copy
cannot forge is the registry's signature: a server trusts its own registry's receipts and
those of the registries whose public keys it is given (``--trust-registry-key``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import QVEIL, REPO, ensure_population, running

from qveil.answer import released_values
from qveil.bundle import RECEIPT_FILE, load_bundle
from qveil.bundle.receipt import check_receipt, parse_public_key, read_receipt, signed_bytes
from qveil.client.sync import ValueClient
from qveil.server.governance.registry import SIGNING_KEY, open_registry, qveil_home
from qveil.server.store import open_store

CONFIG = str(REPO / "configs" / "linewalk-private.toml")
STATES = [0.05, 0.35, 0.65, 0.95]  # LineWalk's states are in [0, 1]


def _run(*argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _main(*argv: str) -> subprocess.CompletedProcess[str]:
    """``qveil ARGV`` in this process (cli_helpers.qveil_main), which must succeed."""
    r = qveil_main(*argv)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _url(p: Path) -> str:
    return f"sqlite:///{p}"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "users.npz"
    _main("dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "60",
         "--seed", "5", "--out", str(out), "--no-progress")  # fmt: skip
    return out


def _train(dataset: Path, out: Path, *extra: str, process: bool = False) -> Path:
    """`qveil train` of a small fqi release, charged in this test's registry: in this
    process, or (``process``) as a real process."""
    argv = ("train", "--mode", "fqi", "--dataset", str(dataset), "--config", CONFIG,
            "--epsilon", "4", "--delta", "1e-5", "--force", "--out", str(out),
            *ensure_population(), *extra)  # fmt: skip
    if process:
        _run(QVEIL, *argv)
    else:
        _main(*argv)
    return out


def _values(tmp: Path, bundle: Path, store: str | None, *extra: str) -> np.ndarray:
    with running(tmp, bundle, *extra, store=store) as srv, ValueClient(srv.target) as c:
        return np.asarray(c.values(STATES))


def _expected(bundle: Path) -> np.ndarray:
    b = load_bundle(bundle)
    return released_values(b, b.box.to_unit(np.asarray(STATES)))


def _logged(store: str, rid: str, path: int) -> dict[float, float]:
    with open_store(store, create=False) as st:
        return {p.x: p.g for p in st.iter_points(rid, path)}


# ------------------------------------------------------------------------------ the key
def test_the_signing_key_is_created_once_and_kept(sql_url: str, tmp_path: Path) -> None:
    """On SQLite and PostgreSQL: the first open draws the key, every later open (a new
    connection, as a new process would) reads the same one; a receipt signed before a
    reopen verifies under the key read after it. Another registry has its own key."""
    with open_registry(sql_url, actor="t") as reg:
        key, rid = reg.public_key, reg.registry_id
        first = reg.sign_receipt(
            release_id="r1",
            population="clinic",
            epsilon=1.0,
            delta=1e-5,
            key_sha256="a" * 64,
            weights_sha256="b" * 64,
            card_sha256="c" * 64,
        )
    assert len(key) == 64 and parse_public_key(key)
    with open_registry(sql_url, actor="t") as reg:
        assert (reg.public_key, reg.registry_id) == (key, rid)
        second = reg.sign_receipt(
            release_id="r2",
            population="clinic",
            epsilon=2.0,
            delta=1e-5,
            key_sha256="d" * 64,
            weights_sha256="e" * 64,
            card_sha256="f" * 64,
        )
    for rc in (first, second):
        assert (rc.public_key, rc.registry_id) == (key, rid)
        parse_public_key(key).verify(bytes.fromhex(rc.signature), signed_bytes(rc))
    # the key is kept once, in the registry's metadata (its private half: never printed)
    with open_store(sql_url, create=False) as st:
        stored = st.releases.meta_value(SIGNING_KEY, lambda: pytest.fail("the key was not stored"))
    assert len(bytes.fromhex(stored)) == 32 and stored not in (key, first.signature)
    with open_registry(_url(tmp_path / "other.sqlite")) as other:
        assert other.public_key != key and other.registry_id != rid


def test_processes_opening_a_new_registry_at_once_agree_on_its_key(tmp_path: Path) -> None:
    """Four `qveil budget registry-key` processes on one registry that does not exist yet:
    the first writer's key wins, and every process prints it."""
    url = _url(tmp_path / "registry.sqlite")
    procs = [
        subprocess.Popen(
            [QVEIL, "budget", "registry-key", "--registry", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    keys = {o.strip() for o, _ in outs}
    with open_registry(url) as reg:
        assert keys == {reg.public_key}


def test_budget_registry_key_prints_the_registrys_public_key(tmp_path: Path) -> None:
    r = _run(QVEIL, "budget", "registry-key")
    with open_registry() as reg:
        assert r.stdout.strip() == reg.public_key
        d = json.loads(_main("budget", "registry-key", "--json").stdout)
        assert d == {"registry_id": reg.registry_id, "public_key": reg.public_key}
    # the default registry is $QVEIL_HOME/registry.sqlite, owner-only (it holds the key)
    home = qveil_home()
    assert home.stat().st_mode & 0o777 == 0o700
    assert (home / "registry.sqlite").stat().st_mode & 0o777 == 0o600
    other = _main("budget", "registry-key", "--registry", _url(tmp_path / "o.sqlite"))
    assert other.stdout.strip() != r.stdout.strip()


# ------------------------------------------------------------------------------ receipts
def test_train_writes_the_registrys_receipt_and_serve_names_it(
    dataset: Path, tmp_path: Path
) -> None:
    b = _train(dataset, tmp_path / "rel" / "bundle", process=True)
    bundle = load_bundle(b)
    rid, card = bundle.bundle_id, bundle.card
    with open_registry() as reg:
        entry = reg.ledger.entry_for_release(rid)
        rc = check_receipt(
            b,
            release_id=rid,
            key_sha256=card["key_sha256"],
            weights_sha256=card["weights_sha256"],
            card_sha256=card["card_sha256"],
            trusted=[reg.public_key],
        )
        assert rc.registry_id == reg.registry_id
    assert entry is not None
    assert (rc.population, rc.epsilon, rc.delta) == (
        "test-users",
        entry.event.epsilon,
        entry.event.delta,
    )
    assert (b / RECEIPT_FILE).stat().st_mode & 0o777 == 0o600
    with running(tmp_path, b) as srv, ValueClient(srv.target) as c:
        first = np.asarray(c.values(STATES))
    out = srv.output()
    assert f"charged to population test-users: eps={rc.epsilon:.6g}" in out, out
    assert f"receipt of registry {rc.registry_id}" in out, out
    assert np.array_equal(first, _expected(b))  # the release's own values
    assert np.array_equal(first, _values(tmp_path, b, None))  # a restart: the same


def test_another_registrys_release_is_served_only_with_its_key_trusted(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release trained with one registry, served by a server whose registry is another
    (another QVEIL_HOME): refused, naming --trust-registry-key, nothing created; with the
    training registry's key (as `qveil budget registry-key` prints it) trusted, served."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    key = _main("budget", "registry-key").stdout.strip()
    monkeypatch.setenv("QVEIL_HOME", str(tmp_path / "another-home"))
    store = tmp_path / "s.sqlite"
    r = _run(QVEIL, "serve", "--bundle", str(b), "--store", _url(store),
             "--listen", "127.0.0.1:0", ok=False)  # fmt: skip
    assert r.returncode == 2 and "does not trust" in r.stderr, r.stderr
    assert "--trust-registry-key" in r.stderr and "Traceback" not in r.stderr
    assert not store.exists()
    with open_registry() as reg:
        assert reg.public_key != key  # the server's own registry: another key
    got = _values(tmp_path, b, _url(store), "--trust-registry-key", key)
    assert np.array_equal(got, _expected(b))
    # a key that is not the training registry's does not help
    with open_registry(_url(tmp_path / "third.sqlite")) as third:
        wrong = third.public_key
    r = _run(QVEIL, "serve", "--bundle", str(b), "--store", _url(tmp_path / "t.sqlite"),
             "--listen", "127.0.0.1:0", "--trust-registry-key", wrong, ok=False)  # fmt: skip
    assert r.returncode == 2 and "does not trust" in r.stderr, r.stderr


# ------------------------------------------------------------------------------ copies
def test_a_copied_bundle_answers_identically_with_any_store(dataset: Path, tmp_path: Path) -> None:
    """`cp -r` of a trained bundle, before and after serving, each served with a store of
    its own (the default beside it, a new one, one that holds another release): the same
    answers, and every store logs the same values for the same states."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    rid = load_bundle(b).bundle_id
    before = tmp_path / "elsewhere" / "before"
    shutil.copytree(b, before)
    first = _values(tmp_path, b, None)
    after = tmp_path / "elsewhere2" / "after"
    shutil.copytree(b, after)
    other = _train(dataset, tmp_path / "other" / "bundle")
    other_store = _url(tmp_path / "other.sqlite")
    _values(tmp_path, other, other_store)
    for copy, store in (
        (before, None),
        (after, _url(tmp_path / "new.sqlite")),
        (after, other_store),
    ):
        assert np.array_equal(first, _values(tmp_path, copy, store))
    assert np.array_equal(first, _expected(b))
    default = _url(b.parent / "qveil-store.sqlite")
    for path in (0, 1):  # a 1-D release, 2 actions
        logged = _logged(default, rid, path)
        assert len(logged) == len(STATES)
        for store in (_url(before.parent / "qveil-store.sqlite"), other_store):
            assert _logged(store, rid, path) == logged


def test_a_byte_copy_of_the_store_answers_identically(dataset: Path, tmp_path: Path) -> None:
    """The bundle and its store file copied byte for byte and served beside the original:
    both answer the same, and both logs pass `qveil audit --bundle`."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    first = _values(tmp_path, b, None)
    copy_dir = tmp_path / "copy"
    shutil.copytree(b.parent, copy_dir)
    cb = copy_dir / "bundle"
    more = [0.2, 0.8]
    with running(tmp_path, b, name="a") as sa, running(tmp_path, cb, name="b") as sb:
        with ValueClient(sa.target) as ca, ValueClient(sb.target) as cc:
            assert np.array_equal(np.asarray(cc.values(STATES)), first)
            assert np.array_equal(np.asarray(ca.values(more)), np.asarray(cc.values(more)))
    for d, process in ((b.parent, True), (copy_dir, False)):
        argv = ("audit", "--store", _url(d / "qveil-store.sqlite"), "--bundle",
                str(d / "bundle"), "--no-record")  # fmt: skip
        r = _run(QVEIL, *argv) if process else _main(*argv)
        assert "every logged value recomputed from its key" in r.stdout, r.stdout


@pytest.mark.postgres
def test_a_database_cloned_from_a_template_answers_identically(
    dataset: Path, tmp_path: Path, pg_url: str
) -> None:
    """The registry and the store on PostgreSQL: a release trained with a PostgreSQL
    registry is served with it; a clone of its store database answers the same."""
    import psycopg

    registry = pg_url  # the registry's tables beside the store's, in one database
    _main("budget", "create", "test-users", "--epsilon", "100", "--delta", "0.5",
          "--registry", registry)  # fmt: skip
    b = _train(dataset, tmp_path / "rel" / "bundle", "--registry", registry)
    with open_registry(registry) as reg:
        key = reg.public_key
    # this server's own registry (QVEIL_HOME) is another: it trusts the PostgreSQL one's key
    first = _values(tmp_path, b, pg_url, "--trust-registry-key", key)
    name = pg_url.rsplit("/", 1)[1]
    clone = f"{name}_clone"
    admin = "postgresql://postgres@127.0.0.1:5432/test"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        conn.execute(f'CREATE DATABASE "{clone}" TEMPLATE "{name}"')
    try:
        clone_url = pg_url.rsplit("/", 1)[0] + "/" + clone
        assert np.array_equal(first, _values(tmp_path, b, clone_url, "--trust-registry-key", key))
        assert np.array_equal(first, _expected(b))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{clone}" WITH (FORCE)')
    assert read_receipt(b) is not None
