"""A bundle's file names and the digest every check uses (qveil.bundle.layout)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from qveil.bundle import layout


def test_file_names_are_distinct_and_the_key_and_receipt_are_named() -> None:
    assert len(set(layout.FILES)) == len(layout.FILES)
    assert layout.WEIGHTS_FILE in layout.FILES and layout.KEY_FILE in layout.FILES
    # the receipt is written by the registry after the bundle's files, so it is not one of them
    assert layout.RECEIPT_FILE not in layout.FILES
    assert all("/" not in name for name in (*layout.FILES, layout.RECEIPT_FILE))


def test_sha256_of_bytes_and_of_a_file_agree(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # larger than one 1 MiB read chunk
    f = tmp_path / "blob"
    f.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert layout.sha256_bytes(data) == expected
    assert layout.sha256_file(f) == expected
    f.write_bytes(data[:-1] + b"\x00")
    assert layout.sha256_file(f) != expected


def test_sha256_of_an_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.write_bytes(b"")
    assert layout.sha256_file(f) == layout.sha256_bytes(b"") == hashlib.sha256().hexdigest()
