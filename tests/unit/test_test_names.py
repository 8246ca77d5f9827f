"""Every product module has a unit-test file named after it, or is listed here with a reason.

The rule (docs/architecture.md, "Tests"): the tests of module ``qveil.a.b`` of part P (core,
server, trainer, client, common, experiments) are ``tests/unit/P/test_a_b.py``: the module's
dotted name below ``qveil``, dots as underscores (unique across parts, so pytest's default
import mode takes every file); an aspect tested apart adds ``_<aspect>``
(``test_noise_batch.py``). Packages' ``__init__`` modules, the Alembic revisions under
``migrations/versions/`` and the generated stubs (``proto/``) are not product modules here.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("core", "server", "trainer", "client", "common", "experiments")

_CLI = "a command-line module: run as `qveil` subprocesses by "

#: module -> why it has no unit-test file named after it (where it is tested instead)
WITHOUT_OWN_FILE: dict[str, str] = {
    "qveil.bundle.layout": "file names only; read and written by test_bundle_io.py",
    "qveil.bundle.models": "the model kinds; loaded and evaluated by test_bundle_io.py",
    "qveil.bundle.verify": "verification on load: test_bundle_io.py (tampering refused)",
    "qveil.cli": "the composition root: tests/integration/test_cli.py",
    "qveil.cli_parser": "how commands declare flags: tests/integration/test_cli.py",
    "qveil.commands.dataset": _CLI + "tests/integration/test_dataset_cli.py",
    "qveil.commands.inspect": _CLI + "tests/integration/test_kfqi_cli.py",
    "qveil.commands.noise": _CLI + "tests/integration/test_fqi_cli.py",
    "qveil.commands.privacy": _CLI + "tests/integration/test_privacy_cli.py",
    "qveil.dataset_types": "types only; used by every dataset test",
    "qveil.fqi_config": "TOML helpers of the configs: tests/unit/trainer/test_trainer_config.py",
    "qveil.json_types": "type aliases only",
    "qveil.kfqi_config": "the kernel config: test_kfqi.py, test_trainer_estimators.py",
    "qveil.privacy.checks": "argument checks of the parameters: test_privacy_params.py",
    "qveil.privacy.record": "the JSON round trip of records: test_privacy_events.py",
    "qveil.release_records": "a protocol; its implementation: test_trainer_private_eval.py",
    "qveil.training_data": "a protocol; both kinds a fit reads: test_dataset_parquet.py",
    "qveil.trainer.commands.collect": _CLI + "tests/integration/test_dataset_cli.py",
    "qveil.trainer.commands.evaluate": _CLI + "tests/integration/test_cli_evaluate.py",
    "qveil.trainer.commands.train": _CLI + "tests/integration/test_cli_train.py",
    "qveil.trainer.distributed": "the fit on Dask: tests/integration/test_distributed_fit.py",
    "qveil.trainer.progress": "progress lines: tests/integration/test_cli_train.py",
    "qveil.trainer.served_eval": "evaluation of a served release: test_kfqi_cli.py",
    "qveil.trainer.train": "the bundle writer: tests/unit/core/test_bundle_io.py",
    "qveil.client.aio": "the asyncio SDK: tests/integration/test_server_e2e.py",
    "qveil.client.calls": "the SDK's calls: through sync and aio",
    "qveil.client.channel": "channel and retries: tests/integration/test_quota_backoff.py",
    "qveil.client.sync": "the SDK: tests/integration/test_admin_server.py",
    "qveil.common.typing": "the API's types: test_common_serde.py",
    "qveil.experiments._util": "helpers of the experiments: test_experiments_*.py",
    "qveil.experiments.chain_mdp": "the chain MDP: test_experiments_chain_fqe.py",
    "qveil.experiments.linewalk": "LineWalk runs: test_experiments_commands_experiments.py",
}


def product_modules() -> dict[str, str]:
    """Dotted name -> part of every product module (no ``__init__``, no Alembic revision)."""
    out = {}
    for part in PARTS:
        base = ROOT / part
        for f in sorted((base / "qveil").rglob("*.py")):
            rel = f.relative_to(base).with_suffix("")
            name = ".".join(rel.parts)
            if rel.name == "__init__" or ".migrations.versions." in name:
                continue
            out[name] = part
    return out


def named_test_file(name: str, part: str) -> Path:
    """The unit-test file named after module ``name`` of ``part``."""
    return (
        ROOT / "tests" / "unit" / part / f"test_{name.removeprefix('qveil.').replace('.', '_')}.py"
    )


def test_every_module_has_its_test_file_or_a_reason() -> None:
    mods = product_modules()
    missing = [m for m, part in mods.items() if not named_test_file(m, part).exists()]
    unlisted = sorted(set(missing) - set(WITHOUT_OWN_FILE))
    assert not unlisted, f"no tests/unit/<part>/test_<module>.py and no reason: {unlisted}"
    stale = sorted(m for m in WITHOUT_OWN_FILE if m not in mods or m not in missing)
    assert not stale, f"listed without a test file, but it is gone or has one: {stale}"


def test_the_rule_names_one_file() -> None:
    assert (
        named_test_file("qveil.server.serving.query", "server").name
        == "test_server_serving_query.py"
    )
    assert named_test_file("qveil.privacy.fqi", "core").name == "test_privacy_fqi.py"
