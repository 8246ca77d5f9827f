"""``receipt.json``: the registry's signed word that a release's charge is in its ledger.

A release is served only if the ledger recorded its charge (non-negotiable 3). Replicas must
not need a shared database to check that, so the registry that records the charge signs a
receipt (Ed25519) naming the release, its population, what it was charged (epsilon, delta)
and the two commitments that make the release what it is: the sha256 of its noise key and of
its weights (and of its card). ``qveil train`` and ``qveil admin retrain`` write the receipt
into the bundle right after the charge; ``qveil serve`` verifies it against the registry
public keys it trusts (its own registry's, and any given with ``--trust-registry-key``) and
against the bundle's own files before it answers anything. A bundle written by a path that
skipped the ledger (the Python API, a hand-made bundle) has no receipt and is refused; a
receipt from a registry the server does not trust, or one that names another key or other
weights, is refused too.

Pure format and signature checks; signing is the registry's
(:mod:`qveil.server.governance.registry`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from qveil.bundle.layout import RECEIPT_FILE
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, echo
from qveil.json_types import JSONMapping, JSONObject

__all__ = [
    "RECEIPT_FORMAT",
    "Receipt",
    "check_receipt",
    "parse_public_key",
    "read_receipt",
    "receipt_summary",
    "signed_bytes",
    "write_receipt",
]

RECEIPT_FORMAT = "qveil.receipt.v1"

#: the command a refused bundle is pointed at
TRAIN_HINT = (
    "train it with `qveil train` (or `qveil admin retrain`), which charges the release to "
    "its population and writes the receipt"
)


@dataclass(frozen=True)
class Receipt:
    """What the registry signed (every field but ``signature`` is signed)."""

    release_id: str
    population: str
    epsilon: float
    delta: float
    key_sha256: str
    weights_sha256: str
    card_sha256: str
    registry_id: str
    #: the signing key, 32 bytes of an Ed25519 public key as hex
    public_key: str
    issued_at: str
    signature: str = ""

    def unsigned(self) -> JSONObject:
        d = asdict(self)
        d.pop("signature")
        return {"format": RECEIPT_FORMAT, **d}

    def to_dict(self) -> JSONObject:
        return {**self.unsigned(), "signature": self.signature}


def signed_bytes(receipt: Receipt) -> bytes:
    """The canonical bytes the signature covers: sorted, compact JSON of every other field."""
    return json.dumps(receipt.unsigned(), sort_keys=True, separators=(",", ":")).encode()


def parse_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from 64 hex digits (what ``qveil budget registry-key`` prints);
    InvalidArgument otherwise."""
    t = text.strip()
    try:
        raw = bytes.fromhex(t)
        if len(raw) != 32:
            raise ValueError("not 32 bytes")
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise InvalidArgument(
            f"a registry public key is 64 hex digits (qveil budget registry-key prints it), "
            f"got {echo(t)}"
        ) from None


def read_receipt(path: str | Path) -> Receipt | None:
    """The bundle's receipt (None when it has none); IntegrityError when unreadable."""
    f = Path(path) / RECEIPT_FILE
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text())
        if not isinstance(d, dict) or d.get("format") != RECEIPT_FORMAT:
            raise ValueError(f"not a {RECEIPT_FORMAT} record")
        fields = {k: d[k] for k in Receipt.__dataclass_fields__}
        fields["epsilon"] = float(fields["epsilon"])
        fields["delta"] = float(fields["delta"])
        for k, v in fields.items():
            if k not in ("epsilon", "delta") and not isinstance(v, str):
                raise ValueError(f"{k} is not a string")
        return Receipt(**fields)
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise IntegrityError(
            f"bundle {echo(str(path))}: {RECEIPT_FILE} is unreadable ({echo(str(exc))})"
        ) from None


def write_receipt(path: str | Path, receipt: Receipt) -> None:
    """Write ``receipt.json`` into the bundle atomically, owner-only (0600)."""
    p = Path(path)
    tmp = p / f".{RECEIPT_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(receipt.to_dict(), indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p / RECEIPT_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_receipt(
    path: str | Path,
    *,
    release_id: str,
    key_sha256: str,
    weights_sha256: str,
    card_sha256: str,
    trusted: Iterable[str],
) -> Receipt:
    """The bundle's receipt, verified: signed by one of the ``trusted`` public keys (hex), for
    this release, its key, its weights and its card. FailedPrecondition (no receipt, an
    untrusted registry) or IntegrityError (a bad signature, another release's receipt, a
    key or weights that are not the ones charged), naming what to do."""
    where = f"bundle {echo(str(path))}"
    rec = read_receipt(path)
    if rec is None:
        raise FailedPrecondition(
            f"{where} has no {RECEIPT_FILE}: nothing shows that its release was charged to a "
            f"population's budget, so it is not served; {TRAIN_HINT}"
        )
    keys = {k.strip().lower() for k in trusted}
    if rec.public_key.lower() not in keys:
        raise FailedPrecondition(
            f"{where}: its receipt is signed by registry {echo(rec.registry_id)} (key "
            f"{rec.public_key[:16]}...), which this server does not trust: serve it with the "
            "registry that charged it (QVEIL_REGISTRY or QVEIL_HOME), or pass that registry's "
            "public key with --trust-registry-key (qveil budget registry-key prints it)"
        )
    try:
        parse_public_key(rec.public_key).verify(bytes.fromhex(rec.signature), signed_bytes(rec))
    except (InvalidSignature, ValueError):
        raise IntegrityError(
            f"{where}: the signature of {RECEIPT_FILE} does not verify (the receipt was edited "
            f"or forged); {TRAIN_HINT}"
        ) from None
    mismatch = [
        name
        for name, got, want in (
            ("release id", rec.release_id, release_id),
            ("noise key", rec.key_sha256, key_sha256),
            ("weights", rec.weights_sha256, weights_sha256),
            ("card", rec.card_sha256, card_sha256),
        )
        if got != want
    ]
    if mismatch:
        raise IntegrityError(
            f"{where}: its receipt was issued for another {', '.join(mismatch)} than the "
            f"bundle holds (a replaced key, edited weights or a receipt copied from another "
            f"bundle): not served; {TRAIN_HINT}"
        )
    return rec


def receipt_summary(rec: Receipt) -> JSONMapping:
    """The receipt's fields an operator reads (no signature)."""
    return {k: v for k, v in rec.unsigned().items() if k != "format"}
