"""Fixtures for the embedded-model tests.

Fast tests use tiny random Llama checkpoints built with transformers (``tiny_llama``). Slow
tests (``-m slow``) use the real embedded models from the user's cache (``EXECSTATE_CACHE``
redirects it); ``registry.prepare`` builds them on first use (smollm2-135m ~15 s, smollm2-moe
~30 s more) and reuses them afterwards.

torch runs single-threaded here, as in tests/model (``torch_single_thread`` in tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from embedded_helpers import make_tiny_llama


@pytest.fixture(autouse=True, scope="package")
def _single_thread(torch_single_thread: None) -> None:
    """Every test here runs with torch single-threaded."""


@pytest.fixture
def tiny_llama(tmp_path: Path) -> Path:
    return make_tiny_llama(tmp_path / "tiny-llama")


@pytest.fixture(scope="session")
def dense_dir() -> Path:
    from execstate.model import registry

    return registry.prepare("smollm2-135m")


@pytest.fixture(scope="session")
def moe_dir() -> Path:
    from execstate.model import registry

    return registry.prepare("smollm2-moe")
