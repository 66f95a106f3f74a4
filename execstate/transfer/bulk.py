"""Bulk channel: KV bytes between two KV pools through NIXL over UCX (docs/contracts.md 5).

A :class:`NixlBulk` owns one NIXL agent with the UCX backend and registers its pool's ``k`` and
``v`` tensors as host memory ("DRAM") once, at construction. The source publishes
:meth:`NixlBulk.metadata` and :meth:`NixlBulk.block_addrs` in its manifest; the receiver pulls
the bytes with a one-sided :meth:`NixlBulk.read` (RDMA-style READ; the source's CPU is not
involved beyond UCX's progress thread).

Threading: :meth:`metadata` (an immutable ``bytes`` captured at construction) and
:meth:`block_addrs` (arithmetic on addresses fixed at construction) may be called from any
thread (the engine thread exports); :meth:`read`, :meth:`stuck_ids`, :meth:`reap_stuck` and
:meth:`close` use the NIXL agent and must be called from one thread at a time (the decode
instance's transfer thread; ``close`` after that thread stopped).

Memory: the pool's pages are mapped on first write (``state/kv_pool.py``), and a read into
never-written blocks pays the page faults inside the copy: 20-70x the copy itself (measured:
95-495 ms instead of 4-7 ms for 32 MiB, on a loaded 2-core machine), kernel time taken from the
engine. A receiver therefore maps its pool ahead (``KVPool.populate_async``, ``MADV_POPULATE_WRITE``:
contents unchanged, safe while the engine writes), off the engine thread.

Failure: a NIXL error or a transfer that does not complete within ``timeout_s`` raises
``TransferError(BULK / TIMEOUT)``; the transfer handle is released (cancelling it) before
raising. If NIXL cannot cancel it, the handle is kept alive under a stuck id
(:meth:`stuck_ids`, :attr:`num_stuck`): the destination blocks of that read may still be
written, so the caller must not reuse them until :meth:`reap_stuck` reports that id (NIXL says
the transfer ended, done or failed, and its handle was released).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from nixl_cu12 import _api as nixl_api
from nixl_cu12._api import nixl_agent, nixl_agent_config, nixl_xfer_handle

from execstate.state.kv_pool import KVPool
from execstate.transfer.checks import kv_layout_of
from execstate.transfer.errors import ErrorCode, TransferError

# The reader waits on its own (transfer) thread, next to an engine that needs the CPU: a few
# immediate completion checks, then sleeps growing from 50 us to 1 ms (a 32 MB read takes ms).
_SPIN_CHECKS = 20
_SLEEP_S = 50e-6
_MAX_SLEEP_S = 1e-3
# Delay (microseconds) between iterations of NIXL's UCX progress thread. The Python
# wrapper (nixl 1.5.1) hard-codes 0, a busy loop that burns a whole core per process
# even when idle (measured: 1.98 CPU-s per 2 s idle; 0.036 with 1000 us). The reader
# drives its own progress while it waits, so the delay only paces the source side.
PROGRESS_DELAY_US = 1000
_agent_lock = threading.Lock()


@contextlib.contextmanager
def _paced_progress_thread() -> Iterator[None]:
    """While constructing an agent, override the wrapper's ``pthrDelay = 0``."""
    bind = nixl_api.nixlBind
    original = bind.nixlAgent

    def make(name: str, cfg: Any) -> object:  # cfg: the binding's nixlAgentConfig (untyped)
        cfg.pthrDelay = PROGRESS_DELAY_US
        return original(name, cfg)

    with _agent_lock:
        bind.nixlAgent = make
        try:
            yield
        finally:
            bind.nixlAgent = original


class NixlBulk:
    """One NIXL agent serving (as source) and reading into (as receiver) one CPU :class:`KVPool`."""

    def __init__(self, pool: KVPool, name: str, timeout_s: float = 30.0) -> None:
        if pool.k.device.type != "cpu" or not (pool.k.is_contiguous() and pool.v.is_contiguous()):
            raise ValueError("NixlBulk registers contiguous host (DRAM) KV pools only")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        layout = kv_layout_of(pool)
        self.pool = pool
        self.name = name
        self.timeout_s = timeout_s
        self.region_nbytes = layout.region_nbytes
        self._num_layers = layout.num_layers
        with _paced_progress_thread():
            self._agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        self._reg = self._agent.register_memory([pool.k, pool.v], "DRAM")
        self._metadata: bytes = self._agent.get_agent_metadata()
        self._remotes: dict[str, bytes] = {}
        self._stuck: dict[int, nixl_xfer_handle] = {}
        self._stuck_ids = itertools.count(1)
        # Address of block 0's K (V) region in each layer; block b adds b * region_nbytes.
        layer_stride = pool.k.stride(0) * pool.k.element_size()
        layers = np.arange(layout.num_layers, dtype=np.uint64) * np.uint64(layer_stride)
        base = np.empty(2 * layout.num_layers, dtype=np.uint64)
        base[0::2] = np.uint64(pool.k.data_ptr()) + layers
        base[1::2] = np.uint64(pool.v.data_ptr()) + layers
        self._base = base

    @property
    def num_stuck(self) -> int:
        """Reads that timed out and could not be cancelled (their destinations are unsafe)."""
        return len(self._stuck)

    def stuck_ids(self) -> frozenset[int]:
        """Ids of the reads that could not be cancelled and have not ended yet."""
        return frozenset(self._stuck)

    def reap_stuck(self) -> list[int]:
        """Release the stuck reads NIXL now reports as ended (``DONE`` or ``ERR``); their ids.

        After this, nothing writes into those reads' destination blocks any more.
        """
        ended = []
        for sid, handle in list(self._stuck.items()):
            if self._xfer_state(handle) == "PROC":
                continue
            try:
                handle.release()
            except Exception:  # still not releasable: try again at the next reap
                continue
            del self._stuck[sid]
            ended.append(sid)
        return ended

    def metadata(self) -> bytes:
        """This agent's NIXL metadata (connection info + registered pool); thread-safe."""
        return self._metadata

    def block_addrs(self, block_ids: Sequence[int]) -> list[list[int]]:
        """Per block: base addresses of its K and V region in every layer (``[K0, V0, K1, V1, ...]``)."""
        return self._addr_table(block_ids).tolist()

    def read(
        self,
        remote_name: str,
        remote_metadata: bytes,
        remote_addrs: Sequence[Sequence[int]],
        local_block_ids: Sequence[int],
    ) -> None:
        """Copy remote blocks (``remote_addrs[i]``, as published by the source's :meth:`block_addrs`)
        into local blocks ``local_block_ids[i]``; return once every byte has landed.

        Adds the remote agent on first use (again if its metadata changed). Raises
        ``TransferError`` on a NIXL error or after ``timeout_s``; ``ValueError`` on bad arguments.
        """
        if len(remote_addrs) != len(local_block_ids):
            raise ValueError(f"{len(remote_addrs)} remote blocks for {len(local_block_ids)} local blocks")
        if not local_block_ids:
            return
        local = self._addr_table(local_block_ids)
        try:
            remote = np.asarray(remote_addrs, dtype=np.uint64)
        except (ValueError, OverflowError) as e:
            raise TransferError(ErrorCode.BAD_MANIFEST, f"remote addresses: {e}") from None
        if remote.shape != local.shape:
            raise TransferError(ErrorCode.BAD_MANIFEST, f"remote address table of shape {remote.shape}")
        self._ensure_remote(remote_name, remote_metadata)
        local_descs, remote_descs = self._coalesced_descs(local, remote)
        try:
            handle = self._agent.initialize_xfer("READ", local_descs, remote_descs, remote_name)
        except Exception as e:  # NIXL raises its own exception types (nixlNotFoundError, ...)
            raise TransferError(
                ErrorCode.BULK, f"NIXL could not create the read: {type(e).__name__} {e}"
            ) from None
        try:
            self._wait(handle)
        finally:
            self._release(handle)

    def close(self) -> None:
        """Forget remote agents and deregister the pool. The object is unusable afterwards."""
        for name in list(self._remotes):
            self._forget(name)
        self._agent.deregister_memory(self._reg)

    # -- internals -------------------------------------------------------------------------------

    def _addr_table(self, block_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(list(block_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.pool.num_blocks):
            raise ValueError(f"block ids out of range for a pool of {self.pool.num_blocks}")
        offsets = ids.astype(np.uint64) * np.uint64(self.region_nbytes)
        return self._base[None, :] + offsets[:, None]

    def _coalesced_descs(self, local: np.ndarray, remote: np.ndarray):  # -> (nixlXferDList, nixlXferDList)
        """Descriptor lists for ``[n, 2L]`` address tables, region-major, with every run of regions
        contiguous on both sides merged into one descriptor (NIXL does not merge them itself)."""
        loc, rem = local.T.reshape(-1), remote.T.reshape(-1)  # adjacent blocks of one layer's K/V
        size = np.uint64(self.region_nbytes)
        breaks = np.ones(loc.size, dtype=bool)
        breaks[1:] = (loc[1:] != loc[:-1] + size) | (rem[1:] != rem[:-1] + size)
        starts = np.flatnonzero(breaks)
        lengths = np.diff(np.append(starts, loc.size)).astype(np.uint64) * size
        tables = []
        for addrs in (loc, rem):
            table = np.zeros((starts.size, 3), dtype=np.uint64)
            table[:, 0] = addrs[starts]
            table[:, 1] = lengths
            tables.append(self._agent.get_xfer_descs(table, "DRAM"))
        return tables[0], tables[1]

    def _ensure_remote(self, name: str, metadata: bytes) -> None:
        if self._remotes.get(name) == metadata:
            return
        if name in self._remotes:
            self._forget(name)
        try:
            added = self._agent.add_remote_agent(metadata)
        except Exception as e:
            raise TransferError(ErrorCode.BULK, f"NIXL rejected the metadata of {name!r}: {e}") from None
        added_name = added.decode() if isinstance(added, bytes) else str(added)
        if added_name != name:
            self._agent.remove_remote_agent(added_name)
            raise TransferError(ErrorCode.BAD_MANIFEST, f"agent metadata names {added_name!r}, not {name!r}")
        self._remotes[name] = metadata

    def _forget(self, name: str) -> None:
        del self._remotes[name]
        with contextlib.suppress(Exception):  # already gone on the NIXL side: nothing to release
            self._agent.remove_remote_agent(name)

    def _wait(self, handle: nixl_xfer_handle) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            state = self._agent.transfer(handle)
            checks = 0
            sleep_s = _SLEEP_S
            while state == "PROC":
                if time.monotonic() > deadline:
                    raise TransferError(ErrorCode.TIMEOUT, f"bulk read not complete after {self.timeout_s} s")
                checks += 1
                if checks > _SPIN_CHECKS:
                    time.sleep(sleep_s)
                    sleep_s = min(2 * sleep_s, _MAX_SLEEP_S)
                state = self._agent.check_xfer_state(handle)
        except TransferError:
            raise
        except Exception as e:
            raise TransferError(ErrorCode.BULK, f"NIXL read failed: {type(e).__name__} {e}") from None
        if state != "DONE":
            raise TransferError(ErrorCode.BULK, f"NIXL read ended in state {state}")

    def _xfer_state(self, handle: nixl_xfer_handle) -> str:
        try:
            return str(self._agent.check_xfer_state(handle))
        except Exception:  # NIXL reports a failed transfer by raising: it ended
            return "ERR"

    def _release(self, handle: nixl_xfer_handle) -> None:
        try:
            handle.release()
        except Exception:  # could not cancel an active transfer: keep it alive, flag the pool
            self._stuck[next(self._stuck_ids)] = handle
