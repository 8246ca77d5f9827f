"""What the server's commands (``qveil serve``, ``admin``) share on the command line beyond
how a command is declared (:mod:`qveil.cli_parser`): how a call takes its arguments from the
flags of the same names. Imports nothing heavy (a command's parser is built before it runs)."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import TypeVar

__all__ = ["call_with_flags"]

_R = TypeVar("_R")


def call_with_flags(
    fn: Callable[..., _R], args: argparse.Namespace, /, *positional: object, **given: object
) -> _R:
    """``fn(*positional, **given)`` where each other parameter of ``fn`` (a function, or a
    dataclass's fields) that has a flag of the same name (``max_batch``: ``--max-batch``)
    gets that flag's value; a parameter with neither keeps its default."""
    flags = {
        name: getattr(args, name)
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in given
        and hasattr(args, name)
    }
    return fn(*positional, **flags, **given)
