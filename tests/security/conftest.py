"""Fixtures of the security tests (docs/security.md): the tiny random MoE with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread):
    """Tiny models: one torch thread is faster on a loaded machine (tests/conftest.py)."""


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("security_moe"), seed=0)
    write_tokenizer(d)
    return d
