"""``qveil evaluate --target`` (qveil.trainer.commands.evaluate) with a token: ``--token-file``
reads it like ``qveil query``; a missing or non-UTF-8 token file, or both --token and
--token-file, is one line on stderr and exit 2, before anything is played. A token file is
read by a real subprocess; the refusals run the same entry point in this process
(cli_helpers.qveil_main). The command's other flags and refusals (``--private`` never goes to
a server): tests/unit/trainer/test_trainer_commands_evaluate.py."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, bad_token_files, qveil_main
from server_helpers import (
    QVEIL,
    ServerProcess,
    Tokens,
    fresh_bundle,
    serving_with_tokens,
)


@pytest.fixture(scope="module")
def server(
    cartpole_release: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Tokens]]:
    tmp = tmp_path_factory.mktemp("evaluate-cli")
    # a release of a real env, trained by `qveil train` (a copy receipted here)
    bundle = fresh_bundle(cartpole_release[0], tmp / "bundle")
    with serving_with_tokens(tmp, bundle) as served:
        yield served


def evaluate(target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [QVEIL, "evaluate", "--target", target, "--episodes", "2", "--seed", "1", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def evaluate_in_process(target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """:func:`evaluate` through the CLI's entry point in this process (the refusals)."""
    return qveil_main("evaluate", "--target", target, "--episodes", "2", "--seed", "1", *argv)


def test_token_file_is_read(server: tuple[ServerProcess, Tokens], tmp_path: Path) -> None:
    sp, tokens = server
    tf = tmp_path / "tok"
    tf.write_text(tokens.query + "\n")
    r = evaluate(sp.target, "--token-file", str(tf), "--json")
    assert r.returncode == 0, r.stderr
    assert {row["policy"].split(" (")[0] for row in json.loads(r.stdout)} >= {"served release"}
    r = evaluate(sp.target, "--token-file", str(tf))  # the table, then its one-line summary
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(
        r"served release -?[\d.]+, random -?[\d.]+ \(mean return over 2 episodes\)",
        r.stdout.splitlines()[-1],
    ), r.stdout
    r = evaluate(sp.target, "--json")  # the server wants a token
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_token_file_problems_are_one_line(
    server: tuple[ServerProcess, Tokens], tmp_path: Path
) -> None:
    target = server[0].target
    good = tmp_path / "tok"
    good.write_text(server[1].query)
    for argv, words in [
        *((["--token-file", str(path)], words) for path, words in bad_token_files(tmp_path)),
        # "--token=T": a token (secrets.token_urlsafe) may start with "-"
        (["--token-file", str(good), f"--token={server[1].query}"], ("not both",)),
    ]:
        assert_one_line_error(evaluate_in_process(target, *argv), "evaluate", *words)


def test_a_release_of_an_unregistered_env_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The test bundle names "LineWalk-v0", which no Gymnasium registry holds: `qveil evaluate
    --target` says so in one line (exit 2), no traceback."""
    from server_helpers import InProcessServer, make_bundle

    bundle = make_bundle(tmp_path / "b", seed=5)
    with InProcessServer(bundle, f"sqlite:///{tmp_path / 's.sqlite'}") as srv:
        r = qveil_main("evaluate", "--target", srv.target, "--episodes", "2")
    assert r.returncode == 2, r.stderr
    assert "cannot play the release's environment" in r.stderr and "Traceback" not in r.stderr
