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
