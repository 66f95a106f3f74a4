"""The kernels' per-thread scratch buffers (csrc/scratch.c).

A prefill-sized MoE call needs tens of MB of temporaries. They must be reused between calls
(no page faults once warm, whatever else the process has allocated and freed), stay correct
when the next call is larger or smaller, and be returned when the thread that made them ends.
"""

from __future__ import annotations

import resource
import threading

import pytest
import torch
from kernel_helpers import moe_call, randn

from execstate.kernels import cpu
from execstate.state.page_map import populate

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C kernels here")

T, H, INTER, E, K = 1024, 256, 384, 8, 2


def _moe_args(t: int, seed: int) -> tuple[torch.Tensor, ...]:
    x = randn(t, H, seed=seed)
    ids = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(seed + r))[:K] for r in range(t)])
    wts = torch.softmax(randn(t, K, seed=seed + 1), dim=-1)
    return x, ids.contiguous(), wts, randn(E, 2 * INTER, H, seed=seed + 2) / 16, randn(E, H, INTER, seed=seed + 3) / 20


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_warm_calls_do_not_page_fault_even_after_the_heap_is_churned() -> None:
    args = _moe_args(T, 0)
    want = cpu.moe(*args)
    out = torch.zeros_like(want)
    faults = []
    for _ in range(3):
        junk = [bytearray(40 << 20) for _ in range(3)]  # big frees: glibc trims / remaps
        del junk
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        moe_call("moe_packed" if cpu.PACKED else "moe", *args, out=out)  # the kernel cpu.moe takes for T
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert torch.equal(out, want)
    # fresh temporaries (~15 MiB) fault >= 8 times even on 2 MiB pages, ~3,700 times on 4 KiB ones
    assert max(faults) <= 2, faults


def test_larger_then_smaller_calls_reuse_the_buffer_correctly() -> None:
    small, large = _moe_args(64, 1), _moe_args(T, 2)
    want_small, want_large = cpu.moe(*small), cpu.moe(*large)
    for _ in range(2):
        assert torch.equal(cpu.moe(*small), want_small)
        assert torch.equal(cpu.moe(*large), want_large)
    # a row of the large call alone, then in the large call (the buffer holds stale rows)
    one = tuple(a[:1].contiguous() if a.dim() == 2 and a.shape[0] == T else a for a in large)
    assert torch.equal(cpu.moe(*one)[0], want_large[0])


def test_a_finished_threads_buffers_are_released() -> None:
    args = _moe_args(T, 3)
    want = cpu.moe(*args)

    def work(out: list[torch.Tensor]) -> None:
        out.append(cpu.moe(*args))

    base = None
    for i in range(12):  # each thread maps ~14 MiB of temporaries; kept, 12 would hold ~170 MiB
        out: list[torch.Tensor] = []
        th = threading.Thread(target=work, args=(out,))
        th.start()
        th.join()
        assert torch.equal(out[0], want)
        if i == 1:
            base = _rss_kib()
    assert base is not None
    assert _rss_kib() - base < 40 * 1024


def _populate_works() -> bool:
    """The kernel takes MADV_POPULATE_WRITE (Linux >= 5.14), which scratch.c asks for."""
    probe = torch.empty(1 << 16, dtype=torch.uint8)
    return populate(probe.data_ptr(), probe.numel())


@pytest.mark.skipif(not cpu.PACKED, reason="no AVX-512 here: no packed MoE")
@pytest.mark.skipif(not _populate_works(), reason="kernel without MADV_POPULATE_WRITE (< 5.14)")
def test_the_fused_packed_moe_grows_the_slot_for_the_other_moe_kernels() -> None:
    """The packed MoE's fused path needs less than gemm.c's MoE (no slot-by-slot products), yet
    takes the shared slot at the unfused layout's size, and scratch.c maps a slot in as it grows:
    so on a fresh thread the fused call makes all of it resident (~60 MiB here, of which it
    touches ~30), and gemm.c's MoE of the same step right after it neither grows the slot nor
    faults in pages."""
    t = 4 * T
    args = _moe_args(t, 4)
    want = moe_call("moe", *args)
    seen: list[int] = []

    def work() -> None:
        out = torch.zeros_like(want)
        rss = _rss_kib()
        moe_call("moe_packed", *args, out=out)  # H, I multiples of 8, k = 2: the fused path
        seen.append(_rss_kib() - rss)
        assert torch.equal(out, want)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        moe_call("moe", *args, out=out)  # ~46 MiB of temporaries: slot-by-slot products, h, outputs
        seen.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert torch.equal(out, want)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert len(seen) == 2, seen
    assert seen[0] >= 45 * 1024, seen  # KiB made resident by the fused call
    assert seen[1] <= 2, seen  # faults of the call after it
