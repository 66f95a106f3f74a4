"""Numerics modes: K/V writes are in place (no temporary of pool size), and the compiled step
gives the same K/V as the eager one within tolerance at every step."""

from __future__ import annotations

import pytest
from conftest import random_net

from execstate.model.world.model import ChunkedWorldModel
from execstate_bench.world_tools import speed


def _check_in_place(model: ChunkedWorldModel) -> None:
    """The largest temporary of a step does not grow with the pool (it is chunk/window-sized)."""
    small = speed.largest_allocation(model, num_blocks=32, steps=3)  # 16 chunks
    large = speed.largest_allocation(model, num_blocks=1024, steps=3)  # 512 chunks
    assert large["pool_bytes"] == 32 * small["pool_bytes"] == 512 * model.spec.kv.bytes_per_chunk()
    assert 0 < large["largest_allocation_bytes"] == small["largest_allocation_bytes"] < small["pool_bytes"]


def test_eager_step_allocates_no_pool_sized_temporary(tiny_model: ChunkedWorldModel) -> None:
    _check_in_place(tiny_model)


@pytest.mark.slow
def test_compiled_kv_matches_eager_and_writes_in_place() -> None:
    """torch.compile (minutes of warm-up on 2 cores: marked slow)."""
    eager = ChunkedWorldModel(random_net(), weights_version="tiny-random")
    compiled = ChunkedWorldModel(random_net(), weights_version="tiny-random", numerics="compiled")
    assert compiled.spec.numerics == "compiled" and eager.spec.numerics == "eager"
    diffs = speed.kv_parity(eager, compiled, steps=6)
    assert len(diffs) == 7 and max(diffs) < 1e-4, diffs
    _check_in_place(compiled)
