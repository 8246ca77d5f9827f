"""qveil.server.store: the persistent per-action GP sample-path store.

``open_store(url)`` gives a :class:`SamplePathStore` on one of three backends:

* ``memory://`` (private) or ``memory://NAME`` (process-global, reopenable): tests, training;
* ``sqlite:////abs/path.sqlite``: the embedded default (WAL, synchronous=FULL, BEGIN IMMEDIATE);
* ``postgresql+psycopg://user@host:port/db``: several replicas sharing one store.

``get_or_sample_paths(release_id, paths, xs)`` returns each state's stored noise on each path
(a release of d coordinates: path a * d + j is action a's coordinate j; d = 1: path a),
drawing new states exactly given their stored neighbours (qveil.noise) and committing them
durably first, all paths in one transaction; ``get_or_sample(release_id, path, xs)`` is its
one-path form.
"""

from __future__ import annotations

import os
from pathlib import Path

from qveil.errors import InvalidArgument
from qveil.rng import NormalSource
from qveil.server.store.base import InsertRecord, ReleaseRecord, SamplePathStore, StoredPoint
from qveil.server.store.integrity import ActionIntegrity, IntegrityReport
from qveil.server.store.memory import MemoryStore
from qveil.server.store.sql import SQLStore

__all__ = [
    "ActionIntegrity",
    "DEFAULT_URL_ENV",
    "InsertRecord",
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
    rng: NormalSource | int | None = None,
    create: bool = True,
    new_ok: bool = True,
    key: bytes | None = None,
    busy_timeout: float = 30.0,
    **options: object,
) -> SamplePathStore:
    """Open (and migrate, with ``create``) a store; refuses unsafe durability settings.

    ``rng=None`` draws release noise from OS entropy (the only production setting; a seed is
    for tests). ``key``: HMAC key of the integrity chain (default: ``$QVEIL_STORE_KEY`` if
    set, else plain SHA-256). ``create=False`` refuses a missing or unmigrated database;
    ``new_ok=False`` refuses a missing or empty one (nothing is created) but migrates an older
    store: every opener except ``qveil admin init-store`` and a first serve.
    """
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise InvalidArgument(f"store URL must be a string, got {url!r}")
    if key is None and os.environ.get("QVEIL_STORE_KEY"):
        key = os.environ["QVEIL_STORE_KEY"].encode("utf-8")
    if url.startswith("memory:"):
        name = url[len("memory:") :].lstrip("/")
        return MemoryStore(name, rng=rng, key=key)

    return SQLStore(
        url,
        rng=rng,
        key=key,
        create=create,
        new_ok=new_ok,
        busy_timeout=busy_timeout,
        **options,  # type: ignore[arg-type,unused-ignore]
    )
