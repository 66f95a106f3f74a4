"""One replica's cache as its KV events describe it (``state/kv_events/events.py``).

:class:`ReplicaIndex` applies the replica's batches in sequence order (``apply``): ``BlockStored``
adds keys to a medium, ``BlockRemoved`` removes them, ``AllBlocksCleared`` empties every medium.
A batch out of order (``seq`` not the next one) is refused with :class:`SequenceGap` and nothing
changes: the subscriber then asks the replay socket for the missing batches, or, when they are no
longer buffered, calls :meth:`reset` (the index empties and accepts the stream from that point:
it may then miss blocks the replica has, never claim one it does not).

Invariant: after applying batches ``0..n`` without gaps, ``keys(medium)`` equals the replica's
set of findable keys in that medium at the end of batch ``n`` (the engine tests compare it with
the block pool). Pure Python; one thread at a time (the subscriber owns it, under its lock).
"""

from __future__ import annotations

from collections.abc import Sequence

from execstate.state.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


class SequenceGap(Exception):
    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"batch {got} arrived while {expected} was expected")
        self.expected = expected
        self.got = got


class ReplicaIndex:
    """Keys per medium, plus the weights version each stored key was announced with."""

    def __init__(self) -> None:
        self._media: dict[bytes, set[str]] = {}  # key -> the media that hold it
        self._counts: dict[str, int] = {}
        self.next_seq = 0
        self.num_batches = 0
        self.weights_versions: set[str] = set()  # versions seen in stored events since the last clear

    def apply(self, seq: int, batch: KVEventBatch) -> None:
        """Apply batch ``seq``; :class:`SequenceGap` (nothing changed) unless it is ``next_seq``."""
        if seq != self.next_seq:
            raise SequenceGap(self.next_seq, seq)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.clear()
            elif isinstance(event, BlockStored):
                self._add(event.block_hashes, event.medium or "pool")
                if event.weights_version is not None:
                    self.weights_versions.add(event.weights_version)
            elif isinstance(event, BlockRemoved):
                self._remove(event.block_hashes, event.medium or "pool")
        self.next_seq = seq + 1
        self.num_batches += 1

    def reset(self, next_seq: int) -> None:
        """Forget everything and accept the stream from ``next_seq`` (batches were lost)."""
        self.clear()
        self.next_seq = next_seq

    def clear(self) -> None:
        self._media.clear()
        self._counts.clear()
        self.weights_versions.clear()

    def media(self, key: bytes) -> frozenset[str]:
        return frozenset(self._media.get(key, ()))

    def keys(self, medium: str = "pool") -> set[bytes]:
        return {k for k, m in self._media.items() if medium in m}

    def count(self, medium: str = "pool") -> int:
        return self._counts.get(medium, 0)

    def longest_run(self, keys: Sequence[bytes]) -> list[frozenset[str]]:
        """The media of each key of the longest prefix of ``keys`` this replica holds (in any
        medium); stops at the first key it does not hold."""
        run: list[frozenset[str]] = []
        for key in keys:
            media = self._media.get(key)
            if not media:
                break
            run.append(frozenset(media))
        return run

    def _add(self, keys: list[bytes], medium: str) -> None:
        for key in keys:
            media = self._media.setdefault(key, set())
            if medium not in media:
                media.add(medium)
                self._counts[medium] = self._counts.get(medium, 0) + 1

    def _remove(self, keys: list[bytes], medium: str) -> None:
        for key in keys:
            media = self._media.get(key)
            if media is None or medium not in media:
                continue
            media.discard(medium)
            self._counts[medium] -= 1
            if not media:
                del self._media[key]
