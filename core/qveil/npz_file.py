"""An ``.npz`` file written atomically: into a temporary file beside it, flushed to disk, then
renamed over the target, so a reader sees the whole file or none (a crash leaves no half
file, and no temporary file on any error). The datasets, prior files and anchor files qveil
writes go through :func:`write_npz_atomic`; prior and anchor files are read back through
:func:`read_npz_members`."""

from __future__ import annotations

import os
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, NotFound, echo

__all__ = ["new_npz_path", "read_npz_members", "write_npz_atomic"]


def new_npz_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as the name of a new ``.npz`` file (``what`` names it in errors): it must end
    in .npz, must not exist, and its directory must (InvalidArgument / NotFound otherwise)."""
    out = Path(os.fspath(path))
    if out.suffix != ".npz":
        article = "an" if what[:1] in "aeiou" else "a"
        raise InvalidArgument(f"{article} {what} must end in .npz, got {echo(out)}")
    if out.exists():
        raise InvalidArgument(f"{what} {echo(out)} already exists")
    if not out.parent.is_dir():
        raise NotFound(f"directory {echo(out.parent)} does not exist")
    return out


def write_npz_atomic(out: Path, arrays: Mapping[str, npt.ArrayLike]) -> None:
    """Write ``arrays`` (name -> array) as the ``.npz`` file ``out``; its directory must
    exist. Replaces ``out`` if it exists (callers that must not overwrite check first)."""
    named = {name: np.asarray(a) for name, a in arrays.items()}
    # numpy's stub checks savez's **kwds against its allow_pickle flag (bool) too, which an
    # array is not: called with the keyword names unchecked (the values are arrays)
    savez: Callable[..., None] = np.savez
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as fh:
            savez(fh, **named)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def read_npz_members(
    path: str | os.PathLike[str], what: str, *, fmt: str, required: Iterable[str]
) -> dict[str, npt.NDArray[np.generic]]:
    """Every array of the qveil ``.npz`` file at ``path`` (``what`` names it in errors), read
    whole: it must exist (NotFound), be a readable archive without pickles, hold ``format``
    equal to ``fmt`` and every name of ``required`` (InvalidArgument otherwise)."""
    p = Path(os.fspath(path))
    if not p.is_file():
        raise NotFound(f"{what} {echo(p)} does not exist")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {name: np.asarray(z[name]) for name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InvalidArgument(f"{echo(p)} is not a readable {what}: {str(exc)[:120]}") from None
    missing = sorted({"format", *required} - set(arrays))
    if missing:
        raise InvalidArgument(f"{echo(p)} is not a qveil {what} (missing {', '.join(missing)})")
    got = str(arrays["format"].item()) if arrays["format"].size == 1 else "?"
    if got != fmt:
        raise InvalidArgument(f"{echo(p)}: {what} format must be {fmt!r}, got {echo(got)}")
    return arrays
