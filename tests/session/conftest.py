"""Fixtures: tiny random Qwen3-MoE checkpoints (two weight seeds, one with a tokenizer); torch
single-threaded (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread) -> None:
    return None


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("session_moe"), seed=0)
    write_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def moe_dir_other_weights(tmp_path_factory) -> Path:
    return make_random("qwen3_moe", tmp_path_factory.mktemp("session_moe_w2"), seed=1)
