"""Every product module has a unit-test file named after it, or is listed here with a reason.

The rule (docs/architecture.md, "Tests"): the tests of module ``qveil.a.b`` of part P (core,
server, trainer, client, common, experiments) are ``tests/unit/P/test_a_b.py``: the module's
dotted name below ``qveil``, dots as underscores (unique across parts, so pytest's default
import mode takes every file); an aspect tested apart adds ``_<aspect>``
(``test_noise_conditionals.py``). Packages' ``__init__`` modules, the Alembic revisions under
``migrations/versions/`` and the generated stubs (``proto/``) are not product modules here.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("core", "server", "trainer", "client", "common", "experiments")

#: module -> why it has no unit-test file named after it (where it is tested instead)
WITHOUT_OWN_FILE: dict[str, str] = {
    "qveil.json_types": "three type aliases (JSONValue, JSONObject, JSONMapping), no code",
    "qveil.training_data": "a Protocol, no code; both kinds a fit reads: test_dataset_parquet.py",
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
