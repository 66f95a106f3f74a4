"""CPU tensors on 2 MiB-aligned transparent huge pages (``madvise(MADV_HUGEPAGE)``), for weights.

Why: a decode step streams every weight once (the standard MoE: ~460 MB; its LM head alone
65 MB), far beyond the caches. On 4 KiB pages the step walks ~110,000 pages: each a TLB miss, and
the hardware prefetchers stop at every 4 KiB boundary; and where each 4 KiB page lands in physical
memory (its cache colour) is the luck of the allocation, so two engines loaded from the same file
in one process differ by several percent per step for nothing they compute differently (the R3
paired bench's A/A control, docs/performance.md 15.6). On this host THP is ``madvise`` only
(``/sys/kernel/mm/transparent_hugepage/enabled``): torch's ``posix_memalign(64)`` allocations
never get huge pages. :func:`empty_huge` allocates ``nbytes`` plus 2 MiB, untouched, takes the
2 MiB-aligned view inside it, and marks the whole 2 MiB pages of that view ``MADV_HUGEPAGE``
before anything writes them, so the first write (the loader's copy) faults in huge pages. The
tail past the last whole 2 MiB page stays on 4 KiB pages (no memory spent on rounding up); the
unaligned head of the allocation is never written, so it maps nothing.

Contract: the result is an uninitialised contiguous tensor of ``shape`` / ``dtype`` whose data
starts 2 MiB-aligned, a view into a private uint8 storage that nothing else references. Below
``min_bytes``, off the CPU, or where ``madvise`` is refused (not Linux) it is a plain
``torch.empty`` (still correct: huge pages change only speed, never contents).
"""

from __future__ import annotations

import math

import torch

from execstate.state.page_map import madvise

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux


def empty_huge(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device: torch.device | str = "cpu",
               min_bytes: int = HUGE_PAGE) -> torch.Tensor:
    """An uninitialised tensor whose data is 2 MiB-aligned on huge pages (module docstring)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < min_bytes:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE_PAGE
    whole = nbytes // HUGE_PAGE * HUGE_PAGE
    madvise(raw.data_ptr() + skip, whole, _MADV_HUGEPAGE)
    return raw[skip:skip + nbytes].view(dtype).view(shape)


def huge_page_kib(tensor: torch.Tensor) -> int:
    """KiB of ``tensor``'s data range mapped by huge pages, from ``/proc/self/smaps`` (the mappings
    that overlap the range, counted whole); 0 where smaps is not readable."""
    lo, hi = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and b > lo
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


__all__ = ["HUGE_PAGE", "empty_huge", "huge_page_kib"]
