"""How the server's commands take a call's arguments from their flags
(qveil.server.commands.flags): each parameter of a function or dataclass with a flag of the
same name gets the flag's value, given arguments win, the others keep their defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from qveil.server.commands.flags import call_with_flags


@dataclass(frozen=True)
class Config:
    bundle: str
    max_batch: int = 4096
    grace: float = 10.0
    insecure: bool = False


def test_a_dataclass_takes_the_flags_of_its_fields() -> None:
    args = argparse.Namespace(bundle="b", max_batch=7, grace=2.5, listen="x", other=1)
    assert call_with_flags(Config, args) == Config("b", 7, 2.5, False)


def test_given_arguments_win_and_parameters_without_flags_keep_defaults() -> None:
    args = argparse.Namespace(bundle="b", max_batch=7)
    assert call_with_flags(Config, args, max_batch=9, insecure=True) == Config("b", 9, 10.0, True)


def test_positional_arguments_and_keyword_only_parameters() -> None:
    def fn(first: str, /, second: int = 0, *rest: int, third: str = "t", **kw: object) -> tuple:
        return first, second, rest, third, kw

    # a positional-only parameter and *args/**kwargs never take flags of their names
    args = argparse.Namespace(first="flag", second=2, rest=(9,), third="T", kw={"x": 1})
    assert call_with_flags(fn, args, "given") == ("given", 2, (), "T", {})


def test_a_missing_required_parameter_is_the_callers_error() -> None:
    with pytest.raises(TypeError):
        call_with_flags(Config, argparse.Namespace(max_batch=1))
