"""``qveil noise`` (qveil.commands.noise) in this process: a seeded summary of an exact OU
path, reproducible and consistent on re-query, as JSON or a table; its flags."""

from __future__ import annotations

import json

import pytest
from cli_helpers import qveil_main


def _summary(*flags: str) -> dict[str, object]:
    r = qveil_main("noise", "--beta", "2", "--sigma", "0.5", "--points", "200", "--json", *flags)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def test_a_seeded_summary_is_reproducible() -> None:
    a, b = _summary("--seed", "3"), _summary("--seed", "3")
    timing = "us_per_point"
    assert {k: v for k, v in a.items() if k != timing} == {
        k: v for k, v in b.items() if k != timing
    }
    assert a["points"] == 200 and a["beta"] == 2.0 and a["sigma"] == 0.5
    assert a["seeded"] is True and a["consistent_on_requery"] is True
    assert 0.0 < float(a["std"]) < 5 * 0.5  # type: ignore[arg-type]
    assert float(a["max_abs"]) >= abs(float(a["mean"]))  # type: ignore[arg-type]
    assert _summary("--seed", "4")["mean"] != a["mean"]


def test_without_a_seed_it_draws_from_os_entropy() -> None:
    a = _summary()
    assert a["seeded"] is False and a["consistent_on_requery"] is True
    assert _summary()["mean"] != a["mean"]


def test_the_table_names_every_field() -> None:
    r = qveil_main("noise", "--beta", "1", "--sigma", "1", "--points", "10", "--seed", "0")
    assert r.returncode == 0
    keys = [ln.split(":")[0].strip() for ln in r.stdout.splitlines()]
    assert keys == list(_summary("--seed", "0"))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sigma", "1"], "the following arguments are required: --beta"),
        (["--beta", "x", "--sigma", "1"], "--beta: invalid float value: 'x'"),
    ],
)
def test_bad_flags_exit_2(argv: list[str], says: str) -> None:
    r = qveil_main("noise", *argv)
    assert r.returncode == 2 and says in r.stderr, r.stderr
