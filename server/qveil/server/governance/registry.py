"""The registry: one budget per population, and the signed receipts of what it charged.

A release's noise is a pure function of its one key (:mod:`qveil.keyed`), so a copy, clone
or restored backup of a bundle or a store answers exactly as the original: there is no
second draw left to prevent, and no record of where the noise lives. What a registry keeps
is what copies cannot forge: the privacy ledger of every population
(``qveil.server.governance.ledger``,
keyed by population name, with its caps) and the audit log of every change (who and when),
in a database of its own (default ``$QVEIL_HOME/registry.sqlite``, ``~/.qveil`` when unset;
``QVEIL_REGISTRY`` or ``--registry`` name another, e.g. a PostgreSQL database).

A registry also holds an Ed25519 signing key, drawn when the registry is created. When a
release is charged (``qveil train``, ``qveil admin retrain``) the registry signs a receipt
(:mod:`qveil.bundle.receipt`: release id, population, epsilon, delta and the commitments to
the release's key, weights and card) that the bundle carries; ``qveil serve`` verifies it
against the registry public keys it trusts, so replicas need no shared database to refuse
a release whose charge was never recorded.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from qveil.bundle.receipt import Receipt, signed_bytes
from qveil.server.governance import audit_log
from qveil.server.governance.admin_db import AdminDB, open_admin_db
from qveil.server.governance.ledger import Ledger
from qveil.server.store import open_store

__all__ = [
    "SIGNING_KEY",
    "Registry",
    "default_registry_url",
    "open_registry",
    "qveil_home",
]

#: ``store_meta`` key of the registry's Ed25519 signing key (raw private bytes, hex)
SIGNING_KEY = "registry_signing_key"


def qveil_home() -> Path:
    """``$QVEIL_HOME``, else ``~/.qveil``: created owner-only (0700) on first use."""
    home = Path(os.environ.get("QVEIL_HOME") or Path.home() / ".qveil").expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def default_registry_url() -> str:
    """``$QVEIL_REGISTRY``, else ``sqlite:///$QVEIL_HOME/registry.sqlite``."""
    url = os.environ.get("QVEIL_REGISTRY")
    if url:
        return url
    return f"sqlite:///{qveil_home() / 'registry.sqlite'}"


def _new_signing_key() -> str:
    raw = Ed25519PrivateKey.generate().private_bytes(
        Encoding.Raw, PrivateFormat.Raw, NoEncryption()
    )
    return raw.hex()


class Registry:
    """The registry database (see the module docstring). Open with :func:`open_registry`."""

    def __init__(self, db: AdminDB, *, registry_id: str, actor: str, signing_key: bytes) -> None:
        self.db = db
        self.url = db.url
        #: the registry database's own random id (a receipt names it)
        self.registry_id = registry_id
        self.actor = actor
        self.ledger = Ledger(db, population=True)
        self._signing = Ed25519PrivateKey.from_private_bytes(signing_key)

    @property
    def public_key(self) -> str:
        """The registry's public key (64 hex digits): what a server trusts receipts by."""
        return self._signing.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def sign_receipt(
        self,
        *,
        release_id: str,
        population: str,
        epsilon: float,
        delta: float,
        key_sha256: str,
        weights_sha256: str,
        card_sha256: str,
    ) -> Receipt:
        """A receipt of a charge the ledger has recorded, signed by this registry."""
        unsigned = Receipt(
            release_id=release_id,
            population=population,
            epsilon=float(epsilon),
            delta=float(delta),
            key_sha256=key_sha256,
            weights_sha256=weights_sha256,
            card_sha256=card_sha256,
            registry_id=self.registry_id,
            public_key=self.public_key,
            issued_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        sig = self._signing.sign(signed_bytes(unsigned)).hex()
        return Receipt(**{**unsigned.__dict__, "signature": sig})

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_registry(url: str | None = None, *, actor: str | None = None) -> Registry:
    """Open (creating and migrating it when new) the registry at ``url`` (default:
    :func:`default_registry_url`)."""
    url = url or default_registry_url()
    store = open_store(url, create=True)  # runs the migrations; a registry logs no noise
    try:
        registry_id = store.releases.store_id
        signing = bytes.fromhex(store.releases.meta_value(SIGNING_KEY, _new_signing_key))
    finally:
        store.close()
    return Registry(
        open_admin_db(url),
        registry_id=registry_id,
        actor=actor or audit_log.default_actor(),
        signing_key=signing,
    )
