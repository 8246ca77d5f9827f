"""The records a release is kept in, as the trainer sees them (qveil.release_records): the
population name check every record runs first (the protocol's implementation, the server's
registry: test_trainer_private_eval.py and the server's governance tests)."""

from __future__ import annotations

import pytest

from qveil.errors import InvalidArgument
from qveil.release_records import MAX_POPULATION_NAME, validate_population


@pytest.mark.parametrize("name", ["clinic-2026", "a", "x" * MAX_POPULATION_NAME, "two words"])
def test_a_good_name_is_returned(name: str) -> None:
    assert validate_population(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "a population name is 1-200 characters without surrounding spaces, got ''"),
        (" x", "got ' x'"),
        ("x\t", "without surrounding spaces"),
        ("p" * (MAX_POPULATION_NAME + 1), "a population name is 1-200 characters"),
        (3, "got '3'"),
        (None, "got 'None'"),
        ("a\nb", "population name 'a\\nb' has unprintable characters"),
        ("a\x00b", "has unprintable characters"),
    ],
)
def test_a_bad_name_is_refused(name: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        validate_population(name)
    assert message in str(exc.value)
    assert len(str(exc.value)) < 200  # the input is echoed at most 80 characters
