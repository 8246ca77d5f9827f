"""The names of a bundle directory's files, and the file digest every check uses."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = [
    "ADMIN_CARD_FILE",
    "BINDING_FILE",
    "CARD_FILE",
    "CONFIG_FILE",
    "CURVE_FILE",
    "FILES",
    "LOG_FILE",
    "WEIGHTS_FILE",
    "sha256_file",
]

WEIGHTS_FILE = "weights.npz"
CARD_FILE = "card.json"
ADMIN_CARD_FILE = "card_admin.json"
CONFIG_FILE = "config.toml"
LOG_FILE = "training_log.csv"
CURVE_FILE = "learning_curve.png"
FILES = (WEIGHTS_FILE, CARD_FILE, ADMIN_CARD_FILE, CONFIG_FILE, LOG_FILE, CURVE_FILE)
BINDING_FILE = "binding.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
