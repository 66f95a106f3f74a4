"""Fixtures for the embedded-model tests.

Fast tests use tiny random Llama checkpoints built with transformers (``tiny_llama``). Slow
tests (``-m slow``) use the real embedded models from the user's cache (``EXECSTATE_CACHE``
redirects it); ``registry.prepare`` builds them on first use (smollm2-135m ~15 s, smollm2-moe
~30 s more) and reuses them afterwards.

torch runs single-threaded here (as in tests/model): on the loaded 2-core CI box a second
intra-op thread made generation ~4x slower (measured 5.4 s vs 1.3 s for 24 tokens).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from embedded_helpers import make_tiny_llama


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
