"""The names of a bundle directory's files, and the file digest every check uses."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = [
    "ADMIN_CARD_FILE",
    "CARD_FILE",
    "CONFIG_FILE",
    "CURVE_FILE",
    "FILES",
    "KEY_FILE",
    "LOG_FILE",
    "RECEIPT_FILE",
    "WEIGHTS_FILE",
    "sha256_bytes",
    "sha256_file",
]

WEIGHTS_FILE = "weights.npz"
CARD_FILE = "card.json"
ADMIN_CARD_FILE = "card_admin.json"
CONFIG_FILE = "config.toml"
LOG_FILE = "training_log.csv"
CURVE_FILE = "learning_curve.png"
#: the release's one noise key (32 bytes from OS entropy, drawn at train): as secret as the
#: weights, owner-only; the card commits to it by ``key_sha256``
KEY_FILE = "noise.key"
#: the registry's signed receipt of the release's charge (:mod:`qveil.bundle.receipt`)
RECEIPT_FILE = "receipt.json"
FILES = (
    WEIGHTS_FILE,
    KEY_FILE,
    CARD_FILE,
    ADMIN_CARD_FILE,
    CONFIG_FILE,
    LOG_FILE,
    CURVE_FILE,
)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
