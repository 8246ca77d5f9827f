"""One budget per population (qveil.server.governance.population, `qveil budget`), with real CLI
processes and a real registry: a population is declared once; every `qveil train` names it
and is recorded in the one registry ledger whatever its output directory; a release its
privacy filter does not let through is refused before any data is read; datasets that share
people (a superset) count against the same budget. Each command path runs once as a real
process; the variations run the same entry point in this process (cli_helpers.qveil_main)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import server_helpers
from cli_helpers import qveil_main
from server_helpers import REPO

from qveil.bundle.receipt import read_receipt
from qveil.privacy.gaussian import gdp_epsilon, gdp_mu

CONFIG = str(REPO / "configs" / "linewalk-private.toml")


def qveil(*argv: str) -> subprocess.CompletedProcess[str]:
    return server_helpers.qveil(*argv, timeout=180)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """60 users, and a superset of 100 (the same seed: the first 60 users are the same)."""
    d = tmp_path_factory.mktemp("data")
    for users in ("60", "100"):
        r = qveil_main("dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", users,
                       "--seed", "5", "--out", str(d / f"u{users}.npz"),
                       "--no-progress")  # fmt: skip
        assert r.returncode == 0, r.stderr
    return d / "u60.npz", d / "u100.npz"


def _train(
    data: Path,
    out: Path,
    population: str = "clinic",
    *,
    run: Callable[..., subprocess.CompletedProcess[str]] = qveil_main,
) -> subprocess.CompletedProcess[str]:
    """``qveil train`` of CONFIG on ``data`` charged to ``population`` (``run``: in this
    process, or :func:`qveil` for a real process)."""
    return run("train", "--mode", "fqi", "--dataset", str(data), "--config", CONFIG,
               "--epsilon", "1", "--delta", "1e-5", "--force", "--out", str(out),
               "--population", population)  # fmt: skip


def _show(name: str) -> dict:  # type: ignore[type-arg]
    r = qveil_main("budget", "show", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_declared_once_shown_and_plotted(tmp_path: Path) -> None:
    r = qveil("budget", "create", "clinic", "--epsilon", "2", "--delta", "1e-5")
    assert r.returncode == 0, r.stderr
    r = qveil_main("budget", "create", "clinic", "--epsilon", "20", "--delta", "1e-5")
    assert r.returncode == 2 and "declared already" in r.stderr, r.stderr
    rep = _show("clinic")
    assert rep["budget"] == {"epsilon": 2.0, "delta": 1e-5} and rep["events"] == []
    assert rep["mu_budget"] == pytest.approx(gdp_mu(epsilon=2.0, delta=1e-5))
    assert rep["remaining"]["epsilon"] == pytest.approx(2.0, rel=1e-6)
    text = qveil("budget", "show", "clinic").stdout
    assert "  spent:     nothing yet (no release charged)" in text.splitlines(), text
    png = tmp_path / "spent.png"
    assert qveil("budget", "show", "clinic", "--plot", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in (["--epsilon", "0"], ["--epsilon", "nan"], ["--delta", "1"]):
        args = {"--epsilon": "1", "--delta": "1e-5"}
        args[bad[0]] = bad[1]
        r = qveil_main("budget", "create", "x", *[a for kv in args.items() for a in kv])
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = qveil_main("budget", "show", "nobody")
    assert r.returncode == 2 and "qveil budget create nobody" in r.stderr


def test_train_needs_a_declared_population(datasets: tuple[Path, Path], tmp_path: Path) -> None:
    r = qveil_main("train", "--mode", "fqi", "--dataset", str(datasets[0]), "--config", CONFIG,
                   "--epsilon", "1", "--delta", "1e-5", "--out", str(tmp_path / "b"))  # fmt: skip
    assert r.returncode == 2 and "--population NAME" in r.stderr, r.stderr
    r = _train(datasets[0], tmp_path / "b", "undeclared")
    assert r.returncode == 2 and "qveil budget create undeclared" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_the_fourth_release_in_another_directory_is_refused_before_reading_data(
    datasets: tuple[Path, Path], tmp_path: Path
) -> None:
    """A budget that three releases at eps 1 fit under and four do not (the Gaussian filter:
    sqrt(3) mu < mu_B < 2 mu). Releases go to three directories; the third is trained on a
    superset of the first dataset under the same population. The fourth, into yet another
    directory and naming a dataset that does not exist, is refused by the budget before any
    data is read (the message is the budget's, not the missing file's)."""
    mu = gdp_mu(epsilon=1.0, delta=1e-5)
    eps_b = gdp_epsilon(delta=1e-5, mu=1.9 * mu)
    r = qveil_main("budget", "create", "clinic", "--epsilon", repr(eps_b), "--delta", "1e-5")
    assert r.returncode == 0, r.stderr
    small, superset = datasets
    for i, (data, where) in enumerate([(small, "a"), (small, "b"), (superset, "c")]):
        r = _train(data, tmp_path / where / "bundle", run=qveil if i == 0 else qveil_main)
        assert r.returncode == 0, r.stderr
        events = _show("clinic")["events"]
        assert len(events) == i + 1
        # the bundle carries the registry's receipt of this charge (what qveil serve checks)
        rc = read_receipt(tmp_path / where / "bundle")
        assert rc is not None and rc.population == "clinic"
        assert rc.release_id == events[-1]["release_id"]
        assert rc.epsilon == pytest.approx(1.0, rel=1e-9)
    rep = _show("clinic")
    assert rep["mu_spent"] == pytest.approx(3**0.5 * mu, rel=1e-6)
    assert "Gaussian privacy filter" in rep["rule"]
    text = qveil_main("budget", "show", "clinic").stdout
    assert (
        f"(Gaussian-DP mu {rep['mu_spent']:.6g} of the budget's {rep['mu_budget']:.6g})" in text
    ), text
    assert rep["remaining"]["epsilon"] < 1.0
    out = tmp_path / "d" / "bundle"
    r = _train(tmp_path / "no-such-dataset.npz", out)
    assert r.returncode == 2, r.stderr
    assert "privacy budget" in r.stderr and "no-such-dataset" not in r.stderr, r.stderr
    assert not out.parent.exists()
    assert len(_show("clinic")["events"]) == 3


def test_a_dataset_declares_its_population(tmp_path: Path) -> None:
    """`qveil dataset collect --population NAME` declares it in the file (shown by `info`);
    `qveil train` without --population charges it; a different --population is refused."""
    data = tmp_path / "declared.npz"
    r = qveil("dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "60", "--seed",
              "6", "--out", str(data), "--no-progress", "--population", "clinic")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "clinic" in qveil_main("dataset", "info", str(data)).stdout
    assert (
        qveil_main("budget", "create", "clinic", "--epsilon", "5", "--delta", "1e-5").returncode
        == 0
    )
    r = qveil("train", "--mode", "fqi", "--dataset", str(data), "--config", CONFIG,
              "--epsilon", "1", "--delta", "1e-5", "--force",
              "--out", str(tmp_path / "a"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(_show("clinic")["events"]) == 1
    assert (
        qveil_main("budget", "create", "other", "--epsilon", "5", "--delta", "1e-5").returncode == 0
    )
    r = _train(data, tmp_path / "b", "other")
    assert r.returncode == 2 and "declares population 'clinic'" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists() and _show("other")["events"] == []


@pytest.mark.parametrize("releases", [1, 8])
def test_spending_plot_is_readable(tmp_path: Path, releases: int) -> None:
    """`qveil budget show --plot`'s figure after 1 and 8 real releases: the time axis spans
    the releases (a day either side of one), it is labelled, and the legend covers no point."""
    from datetime import datetime

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from plot_helpers import assert_legends_off_the_data, assert_texts_inside

    from qveil.server.governance import population
    from qveil.server.governance.registry import open_registry

    for i in range(releases):
        server_helpers.make_bundle(tmp_path / f"b{i}", seed=i)
    with open_registry() as reg:
        rep = population.report(reg, server_helpers.TEST_POPULATION)
    assert len(rep["events"]) == releases
    fig = population.spending_figure(rep)
    try:
        (ax,) = fig.axes
        assert ax.get_xlabel() == "time of the release (UTC)"
        lo, hi = (mdates.num2date(v) for v in ax.get_xlim())
        times = [datetime.fromisoformat(e["at"]) for e in rep["events"]]
        assert lo < min(times) and max(times) < hi
        assert (hi - lo).total_seconds() <= 2 * 86400 + (
            max(times) - min(times)
        ).total_seconds() * 1.2
        assert_texts_inside(fig)
        assert_legends_off_the_data(fig)
    finally:
        plt.close(fig)
    png = tmp_path / "spent.png"
    population.plot_spending(rep, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
