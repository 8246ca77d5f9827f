"""How a ``qveil`` command is declared (a subcommand whose ``--help`` shows its module
docstring as written) and the flags that several commands share. Here, in core, so that the
commands of core, trainer, server and experiments can all use it; it imports nothing heavy,
since a command's parser is built before it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypedDict, Unpack

__all__ = ["Subcommands", "add_command", "add_no_progress"]

#: What ``add_subparsers()`` returns: each command module's ``add_parser`` adds to it.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class ParserOptions(TypedDict, total=False):
    """``add_parser``'s own keywords that :func:`add_command` passes through (typed as
    argparse types them)."""

    aliases: Sequence[str]
    parents: Sequence[argparse.ArgumentParser]
    prog: str | None
    usage: str | None
    epilog: str | None
    add_help: bool
    allow_abbrev: bool


def add_command(
    sub: Subcommands,
    name: str,
    help: str,  # noqa: A002 - argparse's own name for it
    doc: str | None,
    run: Callable[[argparse.Namespace], int] | None = None,
    **kw: Unpack[ParserOptions],
) -> argparse.ArgumentParser:
    """The command ``name`` of ``sub`` (``add_subparsers()``), whose ``--help`` shows ``doc``
    (its module docstring) as written and which ``run`` runs (none: its subcommands set
    their own); ``kw`` as for ``add_parser``."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )
    if run is not None:
        p.set_defaults(func=run)
    return p


def add_no_progress(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--no-progress`` of a command that shows a long job's progress (a bar on a terminal,
    else log lines: :mod:`qveil.trainer.progress`)."""
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress (a bar on a terminal; else a log line per tenth of the work done, "
        "and at least every 5 s)",
    )
