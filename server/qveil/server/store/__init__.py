"""qveil.server.store: the persistent per-(release, path) log of answered noise values.

``open_store(url)`` gives a :class:`SamplePathStore` on one of three backends:

* ``memory://`` (private) or ``memory://NAME`` (process-global, reopenable): tests, training;
* ``sqlite:////abs/path.sqlite``: the embedded default (WAL, synchronous=FULL, BEGIN IMMEDIATE);
* ``postgresql+psycopg://user@host:port/db``: several replicas logging to one store.

``record_paths(release_id, paths, xs, gs)`` logs answered values ``gs[k][i] =
g_{paths[k]}(xs[k][i])`` (a release of d coordinates: path a * d + j is action a's
coordinate j; d = 1: path a), the states not logged yet of all paths in one durable
transaction. The values themselves come from the release's key (:mod:`qveil.keyed`); the
server logs them off the answer path (:mod:`qveil.server.serving.answer_log`).
"""

from __future__ import annotations

import os
from pathlib import Path

from qveil.errors import InvalidArgument
from qveil.server.store.base import ReleaseRecord, SamplePathStore, StoredPoint
from qveil.server.store.integrity import ActionIntegrity, IntegrityReport
from qveil.server.store.memory import MemoryStore
from qveil.server.store.sql import SQLStore

__all__ = [
    "ActionIntegrity",
    "DEFAULT_URL_ENV",
    "IntegrityReport",
    "ReleaseRecord",
    "SamplePathStore",
    "StoredPoint",
    "default_url",
    "open_store",
]

#: Environment variable naming the store URL when ``open_store`` gets none.
DEFAULT_URL_ENV = "QVEIL_STORE_URL"


def default_url() -> str:
    """``$QVEIL_STORE_URL``, else ``sqlite:///$QVEIL_HOME/store.sqlite`` (QVEIL_HOME defaults
    to ~/.local/share/qveil)."""
    url = os.environ.get(DEFAULT_URL_ENV)
    if url:
        return url
    home = Path(os.environ.get("QVEIL_HOME", "~/.local/share/qveil")).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home.resolve() / 'store.sqlite'}"


def open_store(
    url: str | None = None,
    *,
    create: bool = True,
    new_ok: bool = True,
    key: bytes | None = None,
    busy_timeout: float = 30.0,
    **options: object,
) -> SamplePathStore:
    """Open (and migrate, with ``create``) a store; refuses unsafe durability settings.

    ``key``: HMAC key of the integrity chain (default: ``$QVEIL_STORE_KEY`` if
    set, else plain SHA-256). ``create=False`` refuses a missing or unmigrated database;
    ``new_ok=False`` refuses a missing or empty one (nothing is created) but migrates an older
    store: every opener except ``qveil serve``, whose log may start empty.
    """
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise InvalidArgument(f"store URL must be a string, got {url!r}")
    if key is None and os.environ.get("QVEIL_STORE_KEY"):
        key = os.environ["QVEIL_STORE_KEY"].encode("utf-8")
    if url.startswith("memory:"):
        name = url[len("memory:") :].lstrip("/")
        return MemoryStore(name, key=key)

    return SQLStore(
        url,
        key=key,
        create=create,
        new_ok=new_ok,
        busy_timeout=busy_timeout,
        **options,  # type: ignore[arg-type,unused-ignore]
    )
