from __future__ import annotations

from pathlib import Path

import pytest

from execstate.model.random_models import make_random


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory) -> Path:
    return make_random("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"), seed=0)


@pytest.fixture(scope="session")
def moe_dir_other_weights(tmp_path_factory) -> Path:
    return make_random("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe_w2"), seed=1)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory) -> Path:
    return make_random("llama", tmp_path_factory.mktemp("llama"), seed=0)
