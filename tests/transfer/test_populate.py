"""``populate``: maps a pool's pages ahead without changing their contents."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from execstate.state.page_map import populate, resident_pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_maps_pages_and_keeps_contents():
    region = mmap.mmap(-1, 64 << 20)  # fresh anonymous memory: pages mapped on first write
    lazy = np.frombuffer(region, dtype=np.uint8)
    addr = lazy.ctypes.data
    lazy[12345] = 7  # one page written by "the engine"
    resident, total = resident_pages(addr, lazy.nbytes)
    assert resident < total // 2
    if not populate(addr, lazy.nbytes, chunk=8 << 20):
        pytest.skip("kernel without MADV_POPULATE_WRITE (< 5.14)")
    assert resident_pages(addr, lazy.nbytes) == (total, total)
    assert lazy[12345] == 7 and int(lazy.sum()) == 7
    del lazy


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_kv_pool_populate_async_maps_the_whole_pool_and_keeps_it_zero():
    import torch

    from execstate.state.kv_pool import KVPool

    pool = KVPool(2, 64, 16, 2, 64, torch.float32)  # 1 MiB per tensor, untouched
    pool.write(0, torch.tensor([3]), torch.ones(1, 2, 64), torch.ones(1, 2, 64))
    nbytes = pool.k.numel() * pool.k.element_size()
    assert resident_pages(pool.k.data_ptr(), nbytes)[0] < resident_pages(pool.k.data_ptr(), nbytes)[1] // 2
    thread = pool.populate_async()
    assert thread is not None
    assert pool.populate_async() is thread  # mapped once, whoever asks (engine start, PD consumer)
    thread.join(timeout=30)
    for t in (pool.k, pool.v):
        resident, total = resident_pages(t.data_ptr(), nbytes)
        if resident < total:
            pytest.skip("kernel without MADV_POPULATE_WRITE (< 5.14)")
    assert float(pool.k.sum()) == float(pool.v.sum()) == 128.0  # the one written row, nothing else


def test_prefault_kv_is_off_unless_asked_and_serve_has_a_flag():
    from execstate.cli import build_parser
    from execstate.engine.config import EngineConfig
    from execstate.serve.server import engine_config_from_args

    for argv, want in ((["serve", "m"], False), (["serve", "m", "--prefault-kv"], True)):
        assert engine_config_from_args(build_parser().parse_args(argv)).prefault_kv is want
    assert EngineConfig(model="m").prefault_kv is False
