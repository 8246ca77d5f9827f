"""``qveil budget`` as a command (qveil.server.commands.budget), run in this process on a real
registry file: a population declared once and shown (text and JSON, its releases and
spending, a plot), the registry's public key, and refusals (exit 2) that change nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, qveil_main
from server_helpers import make_uncharged_bundle

from qveil.bundle import load_bundle
from qveil.server.governance.registry import open_registry
from qveil.server.governance.release_records import open_release_records


@pytest.fixture
def registry(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'reg.sqlite'}"


def _budget(registry: str, *argv: str) -> object:
    r = qveil_main("budget", *argv, "--registry", registry)
    assert r.returncode == 0, r.stderr
    return r


def test_declare_show_and_spend(registry: str, tmp_path: Path) -> None:
    assert _budget(registry, "show").stdout.strip() == "(no populations declared)"  # type: ignore[attr-defined]
    created = json.loads(
        _budget(registry, "create", "people", "--epsilon", "4", "--delta", "1e-5", "--json").stdout  # type: ignore[attr-defined]
    )
    assert created["population"] == "people" and created["events"] == []
    text = _budget(registry, "show", "people").stdout  # type: ignore[attr-defined]
    assert text.startswith("population people (declared ")
    assert "  budget:    eps=4 delta=1e-05" in text
    assert "  spent:     nothing yet (no release charged)" in text
    assert "  releases:  0" in text
    bundle = make_uncharged_bundle(tmp_path / "b", sigma=50.0)
    with open_release_records(registry, actor="t") as rec:
        rec.record_release(bundle, population="people")
    rid = load_bundle(bundle).bundle_id
    text = _budget(registry, "show", "people").stdout  # type: ignore[attr-defined]
    assert re.search(r"  spent:     eps=\S+ at delta=\S+ \(Gaussian-DP mu \S+ of the budget", text)
    assert "  releases:  1" in text and f"  {rid}  output  eps=" in text
    shown = json.loads(_budget(registry, "show", "people", "--json").stdout)  # type: ignore[attr-defined]
    assert [e["release_id"] for e in shown["events"]] == [rid]
    png = tmp_path / "spend.png"
    _budget(registry, "show", "people", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _budget(registry, "create", "others", "--epsilon", "1", "--delta", "1e-6")
    every = json.loads(_budget(registry, "show", "--json").stdout)  # type: ignore[attr-defined]
    assert sorted(p["population"] for p in every) == ["others", "people"]


def test_the_registry_key(registry: str) -> None:
    key = _budget(registry, "registry-key").stdout.strip()  # type: ignore[attr-defined]
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    both = json.loads(_budget(registry, "registry-key", "--json").stdout)  # type: ignore[attr-defined]
    with open_registry(registry) as reg:
        assert both == {"registry_id": reg.registry_id, "public_key": reg.public_key}
    assert both["public_key"] == key


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["create", "p", "--epsilon", "0", "--delta", "1e-5"], "needs epsilon > 0"),
        (["create", "p", "--epsilon", "1", "--delta", "1"], "0 < delta < 1"),
        (["create", "p", "--epsilon", "inf", "--delta", "1e-5"], "--epsilon must be a finite"),
        (["create", " p", "--epsilon", "1", "--delta", "1e-5"], "population name"),
        (["show", "nobody"], "population 'nobody' is not declared"),
        (["show", "--plot", "x.png"], "--plot needs a population NAME"),
    ],
)
def test_refusals_exit_2_and_change_nothing(registry: str, argv: list[str], says: str) -> None:
    assert_one_line_error(qveil_main("budget", *argv, "--registry", registry), "budget", says)
    with open_registry(registry) as reg:
        assert reg.ledger.datasets() == []


def test_a_population_is_declared_once(registry: str) -> None:
    _budget(registry, "create", "p", "--epsilon", "1", "--delta", "1e-5")
    r = qveil_main(
        "budget", "create", "p", "--epsilon", "9", "--delta", "1e-5", "--registry", registry
    )
    assert_one_line_error(r, "budget", "population 'p' is declared already")
    with open_registry(registry) as reg:
        assert reg.ledger.cap("p").epsilon == 1.0  # type: ignore[union-attr]


def test_usage_errors(registry: str) -> None:
    r = qveil_main("budget", "create", "p", "--registry", registry)
    assert r.returncode == 2 and "--epsilon" in r.stderr
    r = qveil_main("budget", "--registry", registry)
    assert r.returncode == 2 and "OP" in r.stderr
