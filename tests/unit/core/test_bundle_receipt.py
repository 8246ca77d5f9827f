"""qveil.bundle.receipt: the registry's signed receipt of a release's charge, and the refusals
it gives ``qveil serve``.

The first part checks the format on its own (real Ed25519 keys from ``cryptography``): a
receipt round-trips, its signature covers every field, and ``check_receipt`` names what is
wrong with a receipt that is missing, unreadable, edited, signed by a key the caller does
not trust, or issued for another release, key, weights or card.

The second part serves real bundles the ways an operator would get them wrong, through the
server's own start (``ReleaseService.start`` over a real SQLite store, ``LocalServer``) and a
real ``qveil serve`` process: a bundle whose key was replaced (also with the card edited
consistently, so that only the receipt catches it), whose weights were edited (likewise),
whose receipt was removed, edited or copied from another bundle, that a second registry
charged, that the Python API wrote without a charge, or that was written before keyed noise:
each is refused with a message naming what to do, and nothing is stored (no row in the store;
``qveil serve`` does not even create the store file). A second registry's receipt is served
when that registry's public key is trusted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from server_helpers import (
    QVEIL,
    REPO,
    charge,
    ensure_population,
    make_bundle,
    write_output_bundle,
)

from qveil.answer import released_values
from qveil.bundle import (
    ADMIN_CARD_FILE,
    CARD_FILE,
    KEY_FILE,
    RECEIPT_FILE,
    WEIGHTS_FILE,
    card_digest,
    load_bundle,
    merge_card,
    split_card,
    write_kernel_bundle,
)
from qveil.bundle.receipt import (
    RECEIPT_FORMAT,
    TRAIN_HINT,
    Receipt,
    check_receipt,
    parse_public_key,
    read_receipt,
    receipt_summary,
    signed_bytes,
    write_receipt,
)
from qveil.client.sync import ValueClient
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, QveilError
from qveil.keyed import seeded_key
from qveil.server.governance.registry import open_registry
from qveil.server.local import LocalServer
from qveil.server.serving.services import Services
from qveil.server.store import open_store

STATES = np.linspace(-1.0, 2.0, 9)  # make_bundle's interval is [-1, 2]


# ------------------------------------------------------------------------------ the format
def _public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _signed(key: Ed25519PrivateKey, **fields: object) -> Receipt:
    """A receipt signed by ``key`` as the registry signs one (every field but the signature)."""
    base: dict[str, object] = {
        "release_id": "rel-1",
        "population": "clinic",
        "epsilon": 1.5,
        "delta": 1e-5,
        "key_sha256": "a" * 64,
        "weights_sha256": "b" * 64,
        "card_sha256": "c" * 64,
        "registry_id": "reg-1",
        "public_key": _public_hex(key),
        "issued_at": "2026-01-01T00:00:00+00:00",
    }
    unsigned = Receipt(**{**base, **fields})  # type: ignore[arg-type]
    return replace(unsigned, signature=key.sign(signed_bytes(unsigned)).hex())


def _check(path: Path, trusted: list[str], **want: str) -> Receipt:
    """check_receipt of the bundle directory ``path`` against _signed's defaults."""
    args = {
        "release_id": "rel-1",
        "key_sha256": "a" * 64,
        "weights_sha256": "b" * 64,
        "card_sha256": "c" * 64,
    }
    return check_receipt(path, trusted=trusted, **{**args, **want})


def test_a_written_receipt_reads_back_and_verifies(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    rc = _signed(key)
    write_receipt(tmp_path, rc)
    f = tmp_path / RECEIPT_FILE
    assert f.stat().st_mode & 0o777 == 0o600  # owner-only, whatever the umask
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
    assert read_receipt(tmp_path) == rc
    d = json.loads(f.read_text())
    assert d["format"] == RECEIPT_FORMAT and d["signature"] == rc.signature
    # the signature covers the canonical bytes of every other field (sorted, compact JSON)
    assert (
        signed_bytes(rc)
        == json.dumps(
            {k: v for k, v in d.items() if k != "signature"}, sort_keys=True, separators=(",", ":")
        ).encode()
    )
    key.public_key().verify(bytes.fromhex(rc.signature), signed_bytes(rc))
    # trusted keys are matched whatever their case and surrounding space
    assert _check(tmp_path, [f"  {rc.public_key.upper()}\n"]) == rc
    assert "signature" not in receipt_summary(rc) and receipt_summary(rc)["epsilon"] == 1.5
    assert read_receipt(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps(["a list"]),
        json.dumps({"format": "qveil.receipt.v0", "release_id": "r"}),
        "MISSING",  # the signed record without one field
        "NOT_A_STRING",  # the signed record with a number where a string goes
        "BAD_EPSILON",
    ],
)
def test_an_unreadable_receipt_is_an_integrity_error(tmp_path: Path, text: str) -> None:
    d = _signed(Ed25519PrivateKey.generate()).to_dict()
    if text == "MISSING":
        d.pop("key_sha256")
        text = json.dumps(d)
    elif text == "NOT_A_STRING":
        text = json.dumps({**d, "release_id": 7})
    elif text == "BAD_EPSILON":
        text = json.dumps({**d, "epsilon": "lots"})
    (tmp_path / RECEIPT_FILE).write_text(text)
    with pytest.raises(IntegrityError, match=f"{RECEIPT_FILE} is unreadable"):
        read_receipt(tmp_path)


def test_parse_public_key() -> None:
    key = Ed25519PrivateKey.generate()
    parsed = parse_public_key(f" {_public_hex(key)}\n")
    assert parsed.public_bytes(Encoding.Raw, PublicFormat.Raw).hex() == _public_hex(key)
    parsed.verify(key.sign(b"m"), b"m")  # the same key: its signatures verify
    for bad in ("", "zz" * 32, "ab" * 31, "ab" * 33, "x" * 500):
        with pytest.raises(InvalidArgument, match="64 hex digits") as info:
            parse_public_key(bad)
        assert len(str(info.value)) < 300  # the input is echoed shortened


def test_check_receipt_names_each_refusal(tmp_path: Path) -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    mine = _public_hex(key)
    # no receipt: nothing shows a charge; the message names qveil train
    with pytest.raises(FailedPrecondition, match=f"has no {RECEIPT_FILE}") as info:
        _check(tmp_path, [mine])
    assert "qveil train" in str(info.value) and TRAIN_HINT in str(info.value)
    # a registry the caller does not trust: named, with the flag that trusts it
    write_receipt(tmp_path, _signed(other, registry_id="reg-2"))
    with pytest.raises(FailedPrecondition, match="does not trust") as info:
        _check(tmp_path, [mine])
    assert "reg-2" in str(info.value) and "--trust-registry-key" in str(info.value)
    assert _check(tmp_path, [mine, _public_hex(other)]).registry_id == "reg-2"
    # an edited field (a smaller epsilon, say): the signature no longer verifies
    rc = _signed(key)
    write_receipt(tmp_path, replace(rc, epsilon=0.01))
    with pytest.raises(IntegrityError, match="does not verify"):
        _check(tmp_path, [mine])
    # a receipt forged with another key that claims the trusted public key
    forged = _signed(other)
    write_receipt(tmp_path, replace(forged, public_key=mine))
    with pytest.raises(IntegrityError, match="does not verify"):
        _check(tmp_path, [mine])
    write_receipt(tmp_path, replace(rc, signature="not hex"))
    with pytest.raises(IntegrityError, match="does not verify"):
        _check(tmp_path, [mine])
    # a valid receipt of another release, key, weights or card: each mismatch is named
    write_receipt(tmp_path, rc)
    for field, name in (
        ("release_id", "release id"),
        ("key_sha256", "noise key"),
        ("weights_sha256", "weights"),
        ("card_sha256", "card"),
    ):
        with pytest.raises(IntegrityError, match=f"another {name} than the bundle holds"):
            _check(tmp_path, [mine], **{field: "d" * 64})
    with pytest.raises(IntegrityError, match="another noise key, weights than"):
        _check(tmp_path, [mine], key_sha256="d" * 64, weights_sha256="e" * 64)
    assert _check(tmp_path, [mine]) == rc


# ------------------------------------------------------------------------------ serving
def _url(p: Path) -> str:
    return f"sqlite:///{p}"


def _rewrite_card(bundle: Path, **changes: object) -> None:
    """Edit card fields and recompute card_sha256 over the result, as a careful forger
    would: the bundle still loads and verifies, so only the receipt can tell."""
    card = merge_card(
        json.loads((bundle / CARD_FILE).read_text()),
        json.loads((bundle / ADMIN_CARD_FILE).read_text()),
    )
    card.update(changes)
    card["card_sha256"] = card_digest(card)
    public, admin = split_card(card)
    (bundle / CARD_FILE).write_text(json.dumps(public, indent=2, sort_keys=True) + "\n")
    (bundle / ADMIN_CARD_FILE).write_text(json.dumps(admin, indent=2, sort_keys=True) + "\n")


def _replace_key(b: Path) -> None:
    (b / KEY_FILE).write_bytes(seeded_key(999))


def _replace_key_and_card(b: Path) -> None:
    _replace_key(b)
    _rewrite_card(b, key_sha256=hashlib.sha256(seeded_key(999)).hexdigest())


def _edit_weights(b: Path) -> None:
    """Shift the output biases (the Lipschitz bound and the privacy numbers still hold)."""
    with np.load(b / WEIGHTS_FILE) as npz:
        w = {k: npz[k] for k in npz.files}
    w["b1"] = w["b1"] + 0.25
    with (b / WEIGHTS_FILE).open("wb") as fh:
        np.savez(fh, **w)


def _edit_weights_and_card(b: Path) -> None:
    _edit_weights(b)
    _rewrite_card(b, weights_sha256=hashlib.sha256((b / WEIGHTS_FILE).read_bytes()).hexdigest())


def _remove_receipt(b: Path) -> None:
    (b / RECEIPT_FILE).unlink()


def _edit_receipt(b: Path) -> None:
    d = json.loads((b / RECEIPT_FILE).read_text())
    d["epsilon"] = d["epsilon"] / 100  # "charged" less than it was
    (b / RECEIPT_FILE).write_text(json.dumps(d))


#: (how the bundle is damaged, the error serving raises, what the message names)
DAMAGE: dict[str, tuple[Callable[[Path], None], type[QveilError], str]] = {
    "key-replaced": (_replace_key, IntegrityError, "is not the key the release was written with"),
    "key-and-card-replaced": (_replace_key_and_card, IntegrityError, "another noise key, card"),
    "weights-edited": (_edit_weights, IntegrityError, "does not match the card's weights_sha256"),
    "weights-and-card-edited": (_edit_weights_and_card, IntegrityError, "another weights, card"),
    "receipt-removed": (_remove_receipt, FailedPrecondition, "qveil train"),
    "receipt-edited": (_edit_receipt, IntegrityError, "does not verify"),
}


def _start(store_url: str, bundle: Path, *, trusted: tuple[str, ...] = ()) -> None:
    """The server's start (``ReleaseService.start``) of ``bundle`` over a real store, with
    this test's registry (and ``trusted`` keys)."""
    with open_registry() as reg, open_store(store_url) as st:
        Services.create(store=st, registry=reg, trusted_keys=trusted).releases.start(bundle)


def _assert_nothing_stored(store_url: str) -> None:
    with open_store(store_url, create=False) as st:
        assert st.releases.list_releases() == [] and st.count_points() == 0


def _serve_refused(tmp: Path, bundle: Path, *extra: str) -> str:
    """`qveil serve` must refuse to start (exit 2, no traceback) and create no store file."""
    store = tmp / "serve-refused.sqlite"
    r = subprocess.run(
        [QVEIL, "serve", "--bundle", str(bundle), "--store", _url(store)]
        + ["--listen", "127.0.0.1:0", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "serving release" not in out and "Traceback" not in out, out
    assert not list(tmp.glob("serve-refused.sqlite*")), "a refused bundle created its store"
    return out


def _served(bundle: Path, store_url: str) -> np.ndarray:
    with LocalServer(bundle, store_url) as srv, ValueClient(srv.target) as c:
        return np.asarray(c.values(STATES))


def _expected(bundle: Path) -> np.ndarray:
    b = load_bundle(bundle)
    return released_values(b, b.box.to_unit(STATES))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_bundle_is_refused_and_nothing_stored(tmp_path: Path, damage: str) -> None:
    """The intact bundle serves (the release's own values); each damaged copy is refused by
    the server's start and by `qveil serve`, naming the cause, with nothing stored."""
    b = make_bundle(tmp_path / "b", seed=11)
    assert np.array_equal(_served(b, _url(tmp_path / "ok.sqlite")), _expected(b))
    bad = tmp_path / "bad"
    shutil.copytree(b, bad)
    apply, error, message = DAMAGE[damage]
    apply(bad)
    store = _url(tmp_path / "s.sqlite")
    with pytest.raises(error, match=message):
        _start(store, bad)
    _assert_nothing_stored(store)
    assert message in _serve_refused(tmp_path, bad)


def test_a_receipt_copied_from_another_bundle_is_refused(tmp_path: Path) -> None:
    a = make_bundle(tmp_path / "a", seed=12)
    b = make_bundle(tmp_path / "b", seed=13)
    shutil.copy(a / RECEIPT_FILE, b / RECEIPT_FILE)
    store = _url(tmp_path / "s.sqlite")
    with pytest.raises(IntegrityError, match="another release id, noise key, weights, card"):
        _start(store, b)
    _assert_nothing_stored(store)
    assert "copied from another bundle" in _serve_refused(tmp_path, b)


def test_a_second_registrys_receipt_is_served_only_when_trusted(tmp_path: Path) -> None:
    """A bundle charged by another registry (a second QVEIL_HOME): refused by a server of
    this registry, nothing stored; accepted, with the release's own values, when that
    registry's public key is trusted."""
    other = tmp_path / "other-home"
    b = write_output_bundle(tmp_path / "b", **_small_output_bundle(seed=14))
    charge(b, home=other)
    with open_registry(_url(other / "registry.sqlite")) as reg:
        other_key = reg.public_key
    with open_registry() as reg:
        assert reg.public_key != other_key  # two registries, two signing keys
    store = _url(tmp_path / "s.sqlite")
    with pytest.raises(FailedPrecondition, match="does not trust") as info:
        _start(store, b)
    assert "--trust-registry-key" in str(info.value)
    _assert_nothing_stored(store)
    # trusted: the same start passes (the server's own registry is trusted as well)
    _start(store, b, trusted=(other_key,))
    with open_store(store, create=False) as st:
        assert [r.release_id for r in st.releases.list_releases()] == [load_bundle(b).bundle_id]
    # and a real server with the key trusted answers the release's own values
    with LocalServer(b, _url(tmp_path / "served.sqlite"), start=False) as srv:
        srv.services.releases.trusted_keys = (other_key,)
        srv.ready(b)
        assert srv.services.releases.last_receipt.public_key == other_key  # type: ignore[union-attr]
        with ValueClient(srv.target) as c:
            assert np.array_equal(np.asarray(c.values(STATES)), _expected(b))


def _small_output_bundle(seed: int) -> dict[str, object]:
    """write_output_bundle's arguments for a small seeded 3-action network on [-1, 2]."""
    from qveil.bundle import lipschitz_bound
    from qveil.privacy import E3_SETTINGS

    rng = np.random.default_rng(seed)
    w = {
        "W0": rng.normal(size=(8, 1)),
        "b0": rng.normal(size=8),
        "W1": rng.normal(size=(3, 8)) * 0.5,
        "b1": rng.normal(size=3),
    }
    return {
        "weights": w,
        "seed": seed,
        "actions": 3,
        "lipschitz": max(lipschitz_bound(w), 1.0),
        "sigma": 2.0,
        "settings": E3_SETTINGS,
        "env_id": "LineWalk-v0",
        "interval": (-1.0, 2.0),
        "hyperparameters": {"made_by": "tests/unit/core/test_bundle_receipt.py"},
        "config_toml": "# test\n",
        "learning_curve_png": b"",
    }


@pytest.fixture(scope="module")
def trained_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A d = 1 kernel fqi bundle of `qveil train` (LineWalk, 60 users), in a registry of the
    module's own: only its card and arrays are used, to write new bundles with the API."""
    from server_helpers import registry_home

    d = tmp_path_factory.mktemp("kernel")
    with registry_home(d / "home"):
        pop = ensure_population()
        for argv in (
            ["dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "60", "--seed", "5"]
            + ["--out", str(d / "u.npz"), "--no-progress"],
            ["train", "--mode", "fqi", "--dataset", str(d / "u.npz"), "--config"]
            + [str(REPO / "configs" / "linewalk-private.toml"), "--epsilon", "4"]
            + ["--delta", "1e-5", "--out", str(d / "bundle"), *pop],
        ):
            r = subprocess.run(
                [QVEIL, *argv], capture_output=True, text=True, timeout=300, env=dict(os.environ)
            )
            assert r.returncode == 0, r.stderr
    return d / "bundle"


def _write_kernel_copy(src: Path, out: Path) -> Path:
    """A new release of ``src``'s model written by the Python API (write_kernel_bundle): a
    new release id and a new key from OS entropy, no charge, no receipt."""
    b = load_bundle(src)
    card = {k: v for k, v in b.card.items() if k not in ("bundle_id", "created_at")}
    w = b.weights
    return write_kernel_bundle(
        out,
        card=card,
        alpha=w["alpha"],
        centre=float(w["centre"]),
        inducing=w["inducing"],
        config_toml=(src / "config.toml").read_text(),
        training_log_rows=[{"episode": 0, "return": 0.0}],
        learning_curve_png=b"",
    )


def test_a_bundle_the_python_api_wrote_without_a_charge_is_refused(
    tmp_path: Path, trained_kernel: Path
) -> None:
    """write_bundle and write_kernel_bundle write no receipt: serving refuses each, naming
    `qveil train`, and stores nothing; once charged (what `qveil train` does) it serves."""
    mlp = write_output_bundle(tmp_path / "mlp", **_small_output_bundle(seed=15))
    kernel = _write_kernel_copy(trained_kernel, tmp_path / "kernel")
    assert load_bundle(kernel).bundle_id != load_bundle(trained_kernel).bundle_id
    for b in (mlp, kernel):
        assert not (b / RECEIPT_FILE).exists()
        store = _url(tmp_path / f"{b.name}.sqlite")
        with pytest.raises(FailedPrecondition, match=f"has no {RECEIPT_FILE}") as info:
            _start(store, b)
        assert "`qveil train`" in str(info.value)
        _assert_nothing_stored(store)
        assert "`qveil train`" in _serve_refused(tmp_path, b)
        charge(b)
        assert np.array_equal(_served(b, store), _expected(b))


def test_a_bundle_written_before_keyed_noise_is_refused(tmp_path: Path) -> None:
    """No noise.key (and no key_sha256 in its card): refused, naming `qveil train`; the
    receipt it carries does not help."""
    b = make_bundle(tmp_path / "b", seed=16)
    (b / KEY_FILE).unlink()
    card = merge_card(
        json.loads((b / CARD_FILE).read_text()), json.loads((b / ADMIN_CARD_FILE).read_text())
    )
    card.pop("key_sha256")
    card["card_sha256"] = card_digest(card)
    public, admin = split_card(card)
    (b / CARD_FILE).write_text(json.dumps(public))
    (b / ADMIN_CARD_FILE).write_text(json.dumps(admin))
    store = _url(tmp_path / "s.sqlite")
    with pytest.raises(FailedPrecondition, match=f"has no {KEY_FILE}") as info:
        _start(store, b)
    assert "written before" in str(info.value) and "`qveil train`" in str(info.value)
    _assert_nothing_stored(store)
    out = _serve_refused(tmp_path, b)
    assert f"has no {KEY_FILE}" in out and "`qveil train`" in out
