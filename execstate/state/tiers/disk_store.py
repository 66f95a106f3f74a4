"""The local-disk tier: one file per unit under a directory (``UnitStore``; contract in ``store.py``).

Layout: ``<dir>/<first two hex digits>/<key hex>.unit``, each file one blob (``unit.py``).

- **Atomic, first writer wins**: a unit is written to a temporary file in the same directory and
  then hard-linked to its final name; ``link`` fails when the name exists, so a second writer of
  one key (a thread, another process sharing the directory) keeps the first one's file and a
  reader never sees a partial file. The temporary file is removed either way.
- **Survives a restart**: at start the directory is scanned and its units indexed, oldest
  (modification time) first, down to ``capacity_bytes``; they are verified like any unit when
  read. Leftover temporary files are removed.
- Files are not fsync'ed: the tier is a cache (a unit lost in a crash is recomputed).
- Several engines may share a directory; each counts only the units it indexed against its own
  capacity and may delete units another one indexed (that one then recomputes them).
- KV events (``events``, medium ``disk``): every change of the index is reported
  (``unit_events.py``); the record a stored event names is read from the blob's head (the part
  ``put`` writes first; at start, the file's first bytes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from execstate.identity.keys import BlockKey
from execstate.state.kv_events.events import DISK
from execstate.state.tiers.stats import TierStats
from execstate.state.tiers.store import Health, UnitIndex, UnitStore
from execstate.state.tiers.unit import MAGIC, MAX_RECORD_BYTES, UnitRecord, read_record
from execstate.state.tiers.unit_events import UnitEvents

SUFFIX = ".unit"
_HEAD_BYTES = 4096  # read at start to name a found unit in its event (a record is a few hundred bytes)


class DiskStore(UnitStore):
    def __init__(self, directory: str | Path, capacity_bytes: int, policy: str = "lru", backoff_s: float = 5.0,
                 name: str = "disk", events: UnitEvents | None = None) -> None:
        self.name = name
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = UnitIndex(capacity_bytes, policy, events, DISK)
        self.stats = TierStats(name, capacity_bytes)
        self.health = Health(name, self.stats, backoff_s)
        self._tmp_tag = f".tmp-{os.getpid()}-"
        self._scan()

    def path_of(self, key: BlockKey) -> Path:
        h = key.hex()
        return self.dir / h[:2] / f"{h}{SUFFIX}"

    def contains(self, key: BlockKey) -> bool:
        return key in self.index and self.health.available()

    def put(self, key: BlockKey, parts: Sequence[bytes | memoryview]) -> bool:
        if key in self.index:
            return False
        if not self.health.available():
            self.stats.dropped("unavailable")
            return False
        nbytes = sum(memoryview(p).nbytes for p in parts)
        if not self.index.fits(nbytes):
            self.stats.dropped("full")
            return False
        final = self.path_of(key)
        tmp = final.with_name(f"{final.name}{self._tmp_tag}{threading.get_ident()}-{uuid.uuid4().hex[:8]}")
        try:
            final.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.writelines(parts)
            with contextlib.suppress(FileExistsError):  # another writer stored this key first: keep its unit
                os.link(tmp, final)
        except OSError as e:
            self.health.failed(f"write failed: {e}")
            self.stats.dropped("error")
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.health.succeeded()
        record = read_record(parts[0]) if self.index.events is not None and parts else None
        self._drop(self.index.add(key, nbytes, record))
        self.stats.written()
        self._update_size()
        return True

    def get(self, key: BlockKey) -> bytes | None:
        if not self.health.available():
            return None
        try:
            with open(self.path_of(key), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.index.remove(key)  # deleted behind our back (another engine, an operator)
            self._update_size()
            return None
        except OSError as e:
            self.health.failed(f"read failed: {e}")
            return None
        self.index.touch(key)
        return data

    def discard(self, key: BlockKey) -> None:
        self._drop([key] if self.index.remove(key) else [])
        with contextlib.suppress(OSError):
            os.unlink(self.path_of(key))
        self._update_size()

    # -- internals --------------------------------------------------------------------------------

    def _drop(self, keys: list[BlockKey]) -> None:
        for k in keys:
            with contextlib.suppress(OSError):
                os.unlink(self.path_of(k))
        if keys:
            self.stats.dropped("full", len(keys))

    def _update_size(self) -> None:
        self.stats.set_size(len(self.index), self.index.nbytes)

    def _read_record(self, key: BlockKey) -> UnitRecord | None:
        """The record at the head of ``key``'s file (for its event; None without events)."""
        if self.index.events is None:
            return None
        try:
            with open(self.path_of(key), "rb") as f:
                head = f.read(_HEAD_BYTES)
                n = int.from_bytes(head[len(MAGIC) : len(MAGIC) + 4], "little") if len(head) >= len(MAGIC) + 4 else 0
                if len(head) < len(MAGIC) + 4 + n <= len(MAGIC) + 4 + MAX_RECORD_BYTES:
                    head += f.read(len(MAGIC) + 4 + n - len(head))
        except OSError:
            return None
        return read_record(head)

    def _scan(self) -> None:
        found: list[tuple[float, BlockKey, int]] = []
        for sub in self.dir.iterdir():
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for f in sub.iterdir():
                if ".tmp-" in f.name:
                    with contextlib.suppress(OSError):
                        f.unlink()
                    continue
                if not f.name.endswith(SUFFIX):
                    continue
                try:
                    key = BlockKey(bytes.fromhex(f.name[: -len(SUFFIX)]))
                    st = f.stat()
                except (ValueError, OSError):
                    continue
                if len(key) == 32:
                    found.append((st.st_mtime, key, st.st_size))
        for _, key, size in sorted(found):
            if self.index.fits(size):
                self._drop(self.index.add(key, size, self._read_record(key)))
        self._update_size()
