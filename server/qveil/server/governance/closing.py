"""``with obj:`` for the server's resources that hold a database or a running server: the
block gets the object itself and :meth:`Closing.close` runs when it exits, raised or not."""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """Base of a resource that is closed when a ``with`` block on it exits."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
