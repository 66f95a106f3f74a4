"""Model tests run torch single-threaded (``torch_single_thread`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="package")
def _single_thread(torch_single_thread: None) -> None:
    """Every test here runs with torch single-threaded."""
