"""The active release, swapped atomically.

A call takes one snapshot (:meth:`ReleaseHolder.current`) when it starts and uses only that
snapshot, so an activation never mixes two releases within one response and calls in flight
finish on the release they started with. The swap is a single reference assignment under a
lock (readers need no lock: reading a Python reference is atomic).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from qveil.errors import Unavailable

__all__ = ["ActiveRelease", "ReleaseHolder"]


@dataclass(frozen=True, eq=False)
class ActiveRelease:
    """A loaded, verified bundle together with its registration in the store."""

    bundle: Any  # qveil.bundle.Bundle
    record: Any  # qveil.server.store ReleaseRecord

    @property
    def release_id(self) -> str:
        return str(self.bundle.bundle_id)


class ReleaseHolder:
    def __init__(self) -> None:
        self._current: ActiveRelease | None = None
        self._lock = threading.Lock()
        #: Serialises whole activations (load + register + swap) against each other.
        self.activation_lock = threading.Lock()
        self.draining = False

    def current(self) -> ActiveRelease:
        """The active release now; Unavailable while none is loaded or while draining."""
        rel = self._current
        if rel is None:
            raise Unavailable("no release is loaded yet (the server is starting)")
        return rel

    def peek(self) -> ActiveRelease | None:
        return self._current

    def swap(self, new: ActiveRelease) -> ActiveRelease | None:
        """Make ``new`` the active release; return the previous one."""
        with self._lock:
            old, self._current = self._current, new
            return old
