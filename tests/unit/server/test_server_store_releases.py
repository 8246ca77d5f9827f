"""The release registry (``qveil.server.store.releases``), the part of a store that answers
"which release, with which parameters", as its own object over a backend's release hooks:

* a registry built over a real backend (memory, SQLite) registers, reads and lists releases;
  a second registry over the same database sees them;
* ``release`` reads a release's parameters once (they never change), ``get_release`` reads
  its status every time; ``dims`` / ``split`` give a path's (action, coordinate);
* a closed store's registry refuses every call (Unavailable);
* ``store_params`` / ``store_betas``: a bundle's parameters as the registry records them;
* ``register_bundle`` records a real bundle's release (staged) once, and refuses a second
  bundle under the same release id with other parameters (nothing stored changes).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from server_helpers import make_bundle

from qveil.bundle import load_bundle
from qveil.errors import IntegrityError, NotFound, Unavailable
from qveil.server.store import open_store
from qveil.server.store.releases import (
    ReleaseRecord,
    ReleaseRegistry,
    store_betas,
    store_params,
)

KW: dict[str, Any] = dict(fingerprint="f", sigma=1.0, beta=0.5, interval=(0.0, 1.0), n_actions=2)


class CountedReads:
    """A real store's release hooks, counting the reads of one release's row."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _db_get_release(self, release_id: str) -> ReleaseRecord | None:
        self.reads += 1
        rec: ReleaseRecord | None = self.store._db_get_release(release_id)
        return rec


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.sqlite'}"


def test_a_registry_over_a_backend_registers_and_reads_releases(url: str) -> None:
    with open_store(url) as st:
        reg = ReleaseRegistry(st)
        rec = reg.create_release(release_id="r", betas=[0.5, 2.0], **KW)
        assert (rec.dims, rec.n_paths, rec.betas) == (2, 4, (0.5, 2.0))
        assert reg.create_release(release_id="r", betas=[0.5, 2.0], **KW) == rec  # idempotent
        # the store's own registry reads the same database
        assert st.releases.get_release("r") == rec
        assert [r.release_id for r in st.releases.list_releases()] == ["r"]
        assert reg.set_release_status("r", "active").status == "active"
        assert st.releases.get_release("r").status == "active"
        assert reg.store_id == st.releases.store_id
        with pytest.raises(NotFound):
            reg.get_release("nope")


def test_parameters_are_read_once_and_the_status_every_time() -> None:
    with open_store("memory://") as st:
        st.releases.create_release(release_id="r", **KW)
        db = CountedReads(st)
        reg = ReleaseRegistry(db)
        assert reg.release("r").n_actions == 2 and db.reads == 1
        assert reg.release("r").n_actions == 2 and db.reads == 1  # kept
        assert reg.split("r", 1) == (1, 0) and reg.dims("r") == 1 and db.reads == 1
        st.releases.set_release_status("r", "retired")
        assert reg.get_release("r").status == "retired" and db.reads == 2
        assert reg.dims("unknown") == 1  # a path of an unknown release is its action


def test_a_closed_store_registry_refuses() -> None:
    st = open_store("memory://")
    st.releases.create_release(release_id="r", **KW)
    st.close()
    for call in (
        lambda: st.releases.get_release("r"),
        lambda: st.releases.list_releases(),
        lambda: st.releases.create_release(release_id="s", **KW),
        lambda: st.releases.meta_value("k", lambda: "v"),
    ):
        with pytest.raises(Unavailable):
            call()


def test_a_bundle_parameters_as_the_registry_records_them() -> None:
    box = SimpleNamespace(intervals=[SimpleNamespace(lo=-1.0, hi=2.0)])
    one = SimpleNamespace(betas=[0.7], box=box)
    two = SimpleNamespace(betas=[0.7, 3], box=box)
    assert store_params(one) == {"beta": 0.7, "interval": (-1.0, 2.0), "betas": [0.7]}
    assert store_params(two) == {"beta": 0.7, "interval": (-1.0, 2.0), "betas": [0.7, 3.0]}
    assert store_betas([0.7]) == () and store_betas(None) == ()
    assert store_betas([0.7, 3]) == (0.7, 3.0)


def test_a_bundle_is_registered_staged_once_and_a_different_one_refused(tmp_path: Path) -> None:
    first = load_bundle(make_bundle(tmp_path / "a", seed=0, sigma=2.0))
    other = load_bundle(make_bundle(tmp_path / "b", seed=1, sigma=3.0, bundle_id=first.bundle_id))
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        rec = st.releases.register_bundle(first)
        assert (rec.release_id, rec.status, rec.sigma) == (first.bundle_id, "staged", 2.0)
        assert (rec.beta, rec.interval, rec.n_actions) == (first.betas[0], (-1.0, 2.0), 3)
        st.releases.set_release_status(rec.release_id, "active")
        again = st.releases.register_bundle(first)  # the stored record, status kept
        assert again.status == "active" and again.fingerprint == rec.fingerprint
        with pytest.raises(IntegrityError, match="different fingerprint, sigma"):
            st.releases.register_bundle(other)
        assert st.releases.list_releases() == [again]
