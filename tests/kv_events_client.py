"""A plain ZeroMQ replay client of the KV events (the engine and fleet tests)."""

from __future__ import annotations

import zmq


def replay_all(endpoint: str, start: int = 0) -> list[tuple[int, bytes]]:
    """Every batch the publisher still buffers from ``start`` on, as (seq, payload)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        out = []
        while True:
            _, seq, payload = sock.recv_multipart()
            seq_i = int.from_bytes(seq, "big", signed=True)
            if seq_i == -1:
                return out
            out.append((seq_i, payload))
    finally:
        sock.close(0)


class MediaIndex:
    """What a subscriber rebuilds from one replica's batches, written from the wire format alone
    (no router code): keys per medium, and per (medium, key) the event that stored it."""

    def __init__(self) -> None:
        self.keys: dict[str, set[bytes]] = {}
        self.stored: dict[tuple[str, bytes], object] = {}  # (medium, key) -> its BlockStored
        self.next_seq = 0
        self.num_removed: dict[str, int] = {}

    def apply(self, seq: int, payload: bytes) -> None:
        from execstate.state.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch

        assert seq == self.next_seq, f"batch {seq} out of order (expected {self.next_seq})"
        self.next_seq += 1
        for ev in decode_batch(payload).events:
            if isinstance(ev, AllBlocksCleared):
                self.keys.clear()
                self.stored.clear()
            elif isinstance(ev, BlockStored):
                self.keys.setdefault(ev.medium, set()).update(ev.block_hashes)
                bs = ev.block_size
                parent = ev.parent_block_hash
                for j, key in enumerate(ev.block_hashes):  # one event per key, as a chain would be split
                    self.stored[(ev.medium, key)] = BlockStored([key], parent, ev.token_ids[j * bs:(j + 1) * bs], bs,
                                                                ev.lora_id, ev.medium, ev.weights_version)
                    parent = key
            elif isinstance(ev, BlockRemoved):
                self.keys.setdefault(ev.medium, set()).difference_update(ev.block_hashes)
                self.num_removed[ev.medium] = self.num_removed.get(ev.medium, 0) + len(ev.block_hashes)
                for key in ev.block_hashes:
                    self.stored.pop((ev.medium, key), None)

    def follow(self, replay_endpoint: str) -> int:
        """Apply every batch after the last one applied (replay socket); how many."""
        batches = replay_all(replay_endpoint, self.next_seq)
        for seq, payload in batches:
            self.apply(seq, payload)
        return len(batches)

    def medium(self, name: str) -> set[bytes]:
        return self.keys.get(name, set())
