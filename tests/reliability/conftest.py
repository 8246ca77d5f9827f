"""Fixtures shared by the reliability tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import bundle_for_test


@pytest.fixture
def bundle(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """This test's copy of the shared bundle, charged in this test's registry."""
    return bundle_for_test(tmp_path_factory, tmp_path)
