"""The KV tensors: the only module of state/ that holds torch tensors.

Layout: per layer, a flat slot axis ``[num_blocks * block_size, n_kv_heads, head_dim]``
for K and V; block ``b`` owns slots ``[b * block_size, (b + 1) * block_size)``. Writes
are in place (``index_copy_``), never through a temporary of pool size. Unused slots
hold zeros (not garbage), so masked-out positions can never inject NaN/Inf.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from execstate.state.page_map import populate


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"KV pool needs at least one block, got {num_blocks}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = _zeros(shape, dtype, device)
        self.v = _zeros(shape, dtype, device)
        self._populate: threading.Thread | None = None

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v ``[T, n_kv_heads, head_dim]`` at flat ``slots`` ``[T]`` in place, in the pool's
        dtype (fp32 rows into a bf16 pool rounded to nearest even, as the decode kernel rounds)."""
        if k.dtype != self.k.dtype:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def populate_async(self) -> threading.Thread | None:
        """Map the pool's pages now (``state/page_map.py``), on a daemon thread at a lower CPU
        priority, so later writes into never-used blocks do not pay page faults (a prefill's K/V
        writes, a PD receiver's transfers). Contents are unchanged and the engine may write
        meanwhile. Returns the thread (``None`` for a pool not in host memory); once started,
        later calls return the same thread (the pool is mapped once, whoever asks)."""
        if self.k.device.type != "cpu":
            return None
        if self._populate is not None:
            return self._populate

        def run() -> None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + 10)
            for t in (self.k, self.v):
                populate(t.data_ptr(), t.numel() * t.element_size())

        self._populate = threading.Thread(target=run, name="execstate-kv-populate", daemon=True)
        self._populate.start()
        return self._populate

    def block_slots(self, block_id: int) -> slice:
        return slice(block_id * self.block_size, (block_id + 1) * self.block_size)

    def unit_nbytes(self) -> int:
        """Bytes of one block's K and V in every layer (an offload unit's KV, ``export_block``)."""
        return 2 * self.num_layers * self.block_size * self.k[0, 0].numel() * self.k.element_size()

    def export_block(self, block_id: int, out: np.ndarray) -> None:
        """Copy block ``block_id``'s K/V into ``out`` (``uint8[unit_nbytes()]``) in the checksum
        order of ``transfer.checks.block_checksums``: K then V of layer 0, K then V of layer 1, ..."""
        kb, vb = self._byte_views()
        s = self.block_slots(self._check_block(block_id))
        dst = out.reshape(self.num_layers, 2, self.block_size, kb.shape[-1])
        dst[:, 0] = kb[:, s]
        dst[:, 1] = vb[:, s]

    def import_block(self, block_id: int, src: np.ndarray | memoryview | bytes) -> None:
        """Copy a unit's KV bytes (the layout of ``export_block``) into block ``block_id``, in place."""
        kb, vb = self._byte_views()
        s = self.block_slots(self._check_block(block_id))
        arr = np.frombuffer(src, dtype=np.uint8)
        if arr.size != self.unit_nbytes():
            raise ValueError(f"a unit of {arr.size} bytes for blocks of {self.unit_nbytes()}")
        src4 = arr.reshape(self.num_layers, 2, self.block_size, kb.shape[-1])
        kb[:, s] = src4[:, 0]
        vb[:, s] = src4[:, 1]

    def _check_block(self, block_id: int) -> int:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"invalid block id {block_id!r} for a pool of {self.num_blocks}")
        return block_id

    def _byte_views(self) -> tuple[np.ndarray, np.ndarray]:
        """``uint8 [num_layers, num_blocks * block_size, row bytes]`` views of K and V (zero-copy)."""
        if self.k.device.type != "cpu":
            raise ValueError("block export/import needs a CPU KV pool")
        shape = (self.num_layers, self.k.shape[1], -1)
        return self.k.view(torch.uint8).numpy().reshape(shape), self.v.view(torch.uint8).numpy().reshape(shape)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: block ``src``'s K/V in every layer into block ``dst``, for each pair, in
        place (one block-sized slice per layer and tensor; the source is only read)."""
        for src, dst in pairs:
            if not (0 <= src < self.num_blocks and 0 <= dst < self.num_blocks) or src == dst:
                raise ValueError(f"cannot copy block {src} to {dst} in a pool of {self.num_blocks}")
        for src, dst in pairs:
            s, d = self.block_slots(src), self.block_slots(dst)
            self.k[:, d].copy_(self.k[:, s])
            self.v[:, d].copy_(self.v[:, s])


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zero-filled tensor. On CPU an anonymous mapping: the OS hands out zero pages on first
    touch, so a 1 GiB pool costs nothing until blocks are written (``torch.zeros`` writes every
    byte up front: seconds of engine start on a busy machine). Where the OS has it, the mapping
    is marked ``MADV_NOHUGEPAGE``: a prefill's first touch of fresh blocks then faults in the
    4 KiB pages it writes instead of zeroing whole 2 MiB huge pages (numpy's ``calloc`` asks for
    those; measured on the 2-core VM: 2.5 s vs 0.5 s of CPU per GiB touched, which was up to
    a quarter of a fresh 8 x 256-token prefill)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        nbytes *= d
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.from_numpy(np.frombuffer(buf, dtype=np.uint8)).view(dtype).view(shape)
