"""WeightArena: one huge-page mmap holding a CPU model's weights at 4 KiB-aligned offsets."""

from __future__ import annotations

import gc

import torch

from execstate.model.weight_arena import ALIGN, WeightArena


def test_views_are_aligned_disjoint_and_typed():
    specs = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((2, 3, 4), torch.float32), ((1,), torch.int64)]
    arena = WeightArena(specs)
    ptrs = [t.data_ptr() for t in arena.tensors]
    assert all(p % ALIGN == 0 for p in ptrs)
    for t, (shape, dtype) in zip(arena.tensors, specs, strict=True):
        assert tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous()
        assert torch.count_nonzero(t) == 0  # anonymous memory starts zeroed
    for i, t in enumerate(arena.tensors):
        t.fill_(i + 1)
    for i, t in enumerate(arena.tensors):  # writing one view never touched another
        assert torch.all(t == i + 1)
    ends = sorted((p, p + t.numel() * t.element_size()) for p, t in zip(ptrs, arena.tensors, strict=True))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:], strict=False))
    assert arena.nbytes == len(specs) * ALIGN


def test_views_keep_the_memory_alive():
    t = WeightArena([((1024,), torch.float32)]).tensors[0]
    gc.collect()
    t.copy_(torch.arange(1024, dtype=torch.float32))
    assert torch.equal(t, torch.arange(1024, dtype=torch.float32))


def test_loaded_cpu_weights_live_in_one_aligned_arena(tmp_path):
    from execstate.model.loader import load_model
    from execstate.model.random_models import make_random

    model = load_model(make_random("qwen3_moe", tmp_path / "m", seed=0))
    ptrs = sorted(p.data_ptr() for p in model.parameters())
    assert all(p % ALIGN == 0 for p in ptrs)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    # one region: every parameter within [first, first + total rounded up per tensor]
    assert ptrs[-1] - ptrs[0] < total + ALIGN * len(ptrs)
