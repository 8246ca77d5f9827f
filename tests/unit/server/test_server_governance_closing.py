"""The ``with obj:`` base of the server's resources (qveil.server.governance.closing): the block
gets the object itself, and close runs once when it exits, normally or by an exception (which
is not swallowed)."""

from __future__ import annotations

import pytest

from qveil.server.governance.closing import Closing


class Counted(Closing):
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_the_block_gets_the_object_and_close_runs_once() -> None:
    with Counted() as c:
        assert isinstance(c, Counted) and c.closed == 0
    assert c.closed == 1


def test_close_runs_when_the_block_raises_and_the_error_goes_on() -> None:
    c = Counted()
    with pytest.raises(KeyError), c:
        raise KeyError("x")
    assert c.closed == 1


def test_a_resource_must_say_how_it_closes() -> None:
    with pytest.raises(NotImplementedError), Closing():
        pass
