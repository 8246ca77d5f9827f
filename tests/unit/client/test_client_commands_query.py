"""``qveil query`` (qveil.client.commands.query) against a real ``qveil serve`` with a tokens file:
a state written with a leading minus is a state, a malformed state list, an unreadable or non-UTF-8
token file and an action outside the release are one line on stderr and exit 2 (no traceback,
nothing sent). The accepted forms run ``qveil query`` as a real process; the refusals run its entry
point in this process (cli_helpers.qveil_main)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import cli_helpers
import numpy as np
import pytest
from cli_helpers import bad_token_files
from server_helpers import QVEIL, ServerProcess, Tokens, make_bundle, serving_with_tokens

from qveil.client import ValueClient


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens]]:
    tmp = tmp_path_factory.mktemp("query-cli")
    # a 3-action release on the state interval [-1, 2]
    with serving_with_tokens(tmp, make_bundle(tmp / "bundle")) as served:
        yield served


@pytest.fixture
def token_file(server: tuple[ServerProcess, Tokens], tmp_path: Path) -> Path:
    tf = tmp_path / "tok"
    tf.write_text(server[1].query + "\n")
    return tf


def query(target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [QVEIL, "query", "--target", target, *argv], capture_output=True, text=True, timeout=60
    )


def query_in_process(target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """:func:`query` through the CLI's entry point in this process (the refusals)."""
    return cli_helpers.qveil_main("query", "--target", target, *argv)


def assert_one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """One line on stderr, exit 2, and nothing on stdout."""
    cli_helpers.assert_one_line_error(r, "query", *words)
    assert r.stdout == ""


def test_a_state_may_start_with_a_minus(
    server: tuple[ServerProcess, Tokens], token_file: Path
) -> None:
    sp, tokens = server
    for argv, want in (
        (["--state", "-0.01,0.1"], [-0.01, 0.1]),
        (["--state", "-.5"], [-0.5]),
        (["--state", "-1e-3", "--state", "0.2"], [-0.001, 0.2]),
        (["--state=-0.25,0.5"], [-0.25, 0.5]),
    ):
        r = query(sp.target, *argv, "--json", "--token-file", str(token_file))
        assert r.returncode == 0, (argv, r.stderr)
        out = json.loads(r.stdout)
        assert out["states"] == [[v] for v in want]  # states of d = 1 coordinate
        with ValueClient(sp.target, token=tokens.query) as c:
            np.testing.assert_array_equal(np.asarray(out["values"]), c.values(want))
    r = query(sp.target, "--best", "--state", "-0.01,0.1", "--token-file", str(token_file))
    assert r.returncode == 0 and "-0.01" in r.stdout, r.stderr


@pytest.mark.parametrize("state", ["0.5,,0.6", "0.5,", ",0.5", ""])
def test_an_empty_value_in_a_state_list_is_an_error(
    server: tuple[ServerProcess, Tokens], token_file: Path, state: str
) -> None:
    r = query_in_process(server[0].target, "--state", state, "--token-file", str(token_file))
    assert_one_line_error(r, "--state", "empty value")


def test_token_file_problems_are_one_line(
    server: tuple[ServerProcess, Tokens], tmp_path: Path
) -> None:
    target = server[0].target
    for path, words in bad_token_files(tmp_path):
        for mode in (["--state", "0.5"], ["--card"]):
            r = query_in_process(target, *mode, "--token-file", str(path))
            assert_one_line_error(r, "token file", *words)


@pytest.mark.parametrize("action", ["3", "-1", "99999999999"])
def test_an_action_outside_the_release_is_one_line(
    server: tuple[ServerProcess, Tokens], token_file: Path, action: str
) -> None:
    r = query_in_process(
        server[0].target, "--state", "0.5", "--action", action, "--token-file", str(token_file)
    )
    assert_one_line_error(r, f"--action {action}", "actions 0..2")
