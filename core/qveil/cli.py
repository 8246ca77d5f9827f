"""The single ``qveil`` entry point, and the composition root: the one module that names the
layers above core (the trainer, the server, the client, the experiments).

Each subcommand lives in its own module and registers itself through
``add_parser(subparsers)``; its parser stores the function that runs it (``func``). The
modules are named by string and only the one of the command being run is imported
(:func:`build_parser` with the command line): ``qveil --help`` lists the commands from
:data:`SUBCOMMANDS`' one-line helps and imports none of them, and ``qveil query`` loads the
client alone. A missing optional extra (the light client has neither the trainer nor the
server) disables its commands instead of breaking every command.

A command whose module stands below a part it needs (core's ``qveil privacy --forecast`` and
``qveil dataset collect`` need the trainer; the trainer's ``qveil train`` and ``qveil
evaluate --private`` need the registry's ledger, which the server implements:
:class:`qveil.release_records.ReleaseRecords`) receives that part from here as a keyword
argument of its ``func`` (:data:`WIRING`), loaded when it is first called."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from qveil.errors import FailedPrecondition, QveilError
from qveil.version import __version__

# subcommand -> (module providing ``add_parser(subparsers)``, the one-line help that module
# gives it: what ``qveil --help`` lists without importing it; tests/unit/core/test_cli.py
# checks the two agree). The parser stores ``func``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "noise": ("qveil.commands.noise", "sample an exact GP (OU) noise path and summarise it"),
    "dataset": (
        "qveil.commands.dataset",
        "collect, inspect and convert offline datasets (npz, Parquet, CSV, Minari)",
    ),
    "privacy": (
        "qveil.commands.privacy",
        "privacy accountant: epsilon for a sigma, or sigma for an epsilon",
    ),
    "train": (
        "qveil.trainer.commands.train",
        "train a private release and write its bundle: fqi on an offline dataset (the "
        "default, --dataset), or Algorithm 1 online (--mode paper|gdp|output)",
    ),
    "evaluate": ("qveil.trainer.commands.evaluate", "average return of a bundle's greedy policies"),
    "inspect": (
        "qveil.commands.inspect",
        "admin: the un-noised released mean function of a bundle on a grid",
    ),
    "serve": (
        "qveil.server.commands.serve",
        "serve a release bundle over gRPC (and the Open Inference Protocol over gRPC and REST)",
    ),
    "query": ("qveil.client.commands.query", "query released values from a qveil server"),
    "admin": (
        "qveil.server.commands.admin",
        "retrain under the privacy ledger; list, activate, retire releases; budgets",
    ),
    "budget": (
        "qveil.server.commands.budget",
        "declare a population's privacy budget, or show its spending",
    ),
    "audit": (
        "qveil.server.commands.audit",
        "verify stored noise: integrity and statistical tests",
    ),
    "experiments": (
        "qveil.experiments.commands.experiments",
        "reproduce the papers' figures and checks",
    ),
}


# run function ("module.qualname") -> its keyword argument -> "module:attribute" that provides it
WIRING: dict[str, dict[str, str]] = {
    "qveil.commands.privacy.run": {
        "forecast": "qveil.trainer.forecast:forecast",
        "env_actions": "qveil.trainer.env:action_count",
    },
    "qveil.commands.dataset.run_collect": {
        "collect": "qveil.trainer.commands.collect:collect_command"
    },
    "qveil.trainer.commands.train.run": {
        "records": "qveil.server.governance.release_records:open_release_records"
    },
    "qveil.trainer.commands.evaluate.run": {
        "records": "qveil.server.governance.release_records:open_release_records"
    },
}


# object: the callable is found by name at run time (importlib), so its signature and result
# are not known here; the run function that receives it names the type it expects
def provided(spec: str) -> Callable[..., object]:
    """The callable ``module:attribute``, imported when it is first called; a missing optional
    extra is a FailedPrecondition naming it (one line and exit 2, not a traceback)."""

    def call(*args: object, **kwargs: object) -> object:
        module, attr = spec.split(":")
        try:
            target = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise FailedPrecondition(
                f"needs {exc.name!r}; install qveil with its extras "
                "(pip install 'qveil[server,trainer]')"
            ) from None
        return target(*args, **kwargs)

    return call


def run(args: argparse.Namespace) -> int:
    """Run the parsed command's ``func`` with what :data:`WIRING` says it needs."""
    func = args.func
    wired = WIRING.get(f"{func.__module__}.{func.__qualname__}", {})
    return int(func(args, **{name: provided(spec) for name, spec in wired.items()}) or 0)


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand a command line names (its first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``qveil`` parser. With the command line ``argv``, only the module of the command it
    names is imported (the others are listed by their help line); with None, every one."""
    chosen = None if argv is None else _command(argv)
    parser = argparse.ArgumentParser(
        prog="qveil",
        description="Private value-function release with functional noise. The default "
        "release is fqi: private fitted-Q iteration on an offline dataset of users' episodes "
        "(qveil train --dataset); the paper's Algorithm 1 modes train online.",
    )
    parser.add_argument("--version", action="version", version=f"qveil {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_line) in SUBCOMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=help_line)  # listed; its module is not loaded
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # an optional extra is not installed, or not built yet
            if exc.name == module:
                continue
            p = sub.add_parser(name, help=f"(unavailable: {exc.name} is not installed)")
            p.set_defaults(func=_missing(name, exc), unavailable=True)
            continue
        mod.add_parser(sub)
    return parser


def _missing(name: str, exc: ImportError):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        print(
            f"qveil {name}: needs {exc.name!r}; install qveil with its extras "
            f"(pip install 'qveil[server,trainer]')",
            file=sys.stderr,
        )
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    # everything qveil writes (bundles, stores and their -wal/-shm, ledgers, exports, token
    # files) holds private data or key material: owner-only, whatever umask the shell has
    os.umask(0o077)
    if list(sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:
        # the server runs many small forwards in a thread pool: single-threaded BLAS (set
        # before numpy loads; an explicit OPENBLAS_NUM_THREADS wins)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    # an unavailable command takes any arguments: it says which package it needs
    args, unknown = parser.parse_known_args(words)
    if unknown and not getattr(args, "unavailable", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return run(args)
    except QveilError as exc:
        print(f"qveil {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `qveil ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
