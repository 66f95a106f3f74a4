"""The ZeroMQ publisher of KV cache events, with a replay socket (docs/fleet.md).

Wire (vLLM's ``ZmqEventPublisher`` shape, so its subscribers work unchanged):

- **PUB** socket (``endpoint``): each batch is one multipart message ``[topic, seq, payload]``;
  ``seq`` is the batch's sequence number, 8 bytes big-endian, 0, 1, 2, ... without gaps from the
  publisher's start; ``payload`` the msgpack :class:`~execstate.state.kv_events.events.KVEventBatch`.
  The first batch (seq 0) is ``[AllBlocksCleared]``.
- **ROUTER** replay socket (``replay_endpoint``): a subscriber that (re)connects or sees a gap
  sends ``start_seq`` (8 bytes big-endian) from a DEALER (``[b"", start_seq]``) or REQ socket and
  gets every batch still buffered from ``start_seq`` on, each as ``[b"", seq, payload]``, then
  ``[b"", seq=-1, b""]`` (the end). The last ``buffer_steps`` batches are kept; a subscriber that
  asks for an older one gets the buffered ones after it, and must treat the gap as a reason to
  start over (the publisher's ``AllBlocksCleared`` semantics: drop the index, rebuild).

Access (``auth.py``): on loopback the sockets are plain; on any other address both are
CURVE servers under the instances' shared ring (:class:`~execstate.identity.secret_ring.SecretRing`),
and without one the constructor refuses with a ``ValueError`` naming the fix.

Threads: :meth:`publish` (any thread, never blocks: a bounded queue) hands batches to the
publisher's own thread, which owns both sockets, numbers and sends the batches and answers replay
requests. A full queue is dropped whole and replaced by one ``AllBlocksCleared`` batch, so a
subscriber's index can only lose entries, never keep a block that is gone. :meth:`close` sends
what is queued and stops (idempotent).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time

import zmq

from execstate.identity.secret_ring import SECRET_ENV, SecretRing
from execstate.state.kv_events.auth import is_loopback, secure_server
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import AllBlocksCleared, KVEventBatch, encode_batch

logger = logging.getLogger("execstate.kv_events")
_POLL_MS = 20
END_SEQ = -1


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


class ZmqEventPublisher:
    """Binds the two sockets at construction (``zmq.ZMQError`` if an address is taken) and starts
    its thread. ``endpoint`` / ``replay_endpoint`` are the bound addresses (a port 0 resolved)."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int | None = None,
                 ring: SecretRing | None = None) -> None:
        """``ring``: the instances' shared secrets, required for a non-loopback endpoint."""
        self.config = config
        endpoints = [config.endpoint] + ([config.replay_endpoint] if config.replay_endpoint else [])
        self.secured = not all(is_loopback(e) for e in endpoints)
        if self.secured and ring is None:
            raise ValueError(f"kv events on {', '.join(endpoints)}: a feed reachable from other machines needs "
                             f"authentication; set the instances' shared secret ({SECRET_ENV}, CURVE keys are "
                             "derived from it) or bind to 127.0.0.1")
        self.data_parallel_rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._ctx = zmq.Context() if self.secured else zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
        self._auth = None
        if self.secured:
            assert ring is not None
            self._auth = secure_server(self._ctx, [s for s in (self._pub, self._replay) if s is not None], ring)
        self._pub.bind(config.endpoint)
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint: str | None = None
        if self._replay is not None:
            assert config.replay_endpoint is not None
            self._replay.bind(config.replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.num_dropped = 0  # batches dropped because the queue was full
        self._count_lock = threading.Lock()
        self._accepted = 0  # batches publish() queued
        self._handled = 0  # of those, sent or dropped by the publisher thread
        self._overflow = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="execstate-kv-events", daemon=True)
        self.publish(KVEventBatch(time.time(), [AllBlocksCleared()], data_parallel_rank))
        self._thread.start()

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch sent will carry (publisher thread's view)."""
        return self._seq

    def publish(self, batch: KVEventBatch) -> None:
        """Queue one batch (any thread; never blocks)."""
        if self._closed:
            return
        try:
            with self._count_lock:
                self._queue.put_nowait(batch)
                self._accepted += 1
        except queue.Full:
            self._overflow.set()

    def wait_sent(self, timeout: float = 5.0) -> bool:
        """Wait until every batch queued before this call was sent (in the replay buffer, on the
        PUB socket) or dropped; False if ``timeout`` passed first or the publisher is closed."""
        with self._count_lock:
            target = self._accepted
        deadline = time.monotonic() + timeout
        while self._handled < target:
            if self._closed or time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop the thread, close the sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout)
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        if self._auth is not None:
            self._auth.stop()
            self._ctx.term()

    # -- publisher thread -------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            self._drain()
            if self._stop.is_set():
                self._drain()
                return
            if self._replay is None:
                time.sleep(_POLL_MS / 1000)
                continue
            try:
                if dict(poller.poll(_POLL_MS)).get(self._replay):
                    self._answer_replay()
            except zmq.ZMQError:
                logger.exception("kv events replay socket failed")

    def _drain(self) -> None:
        if self._overflow.is_set():
            self._overflow.clear()
            dropped = 0
            while True:
                try:
                    self._queue.get_nowait()
                    dropped += 1
                    self._handled += 1
                except queue.Empty:
                    break
            self.num_dropped += dropped + 1
            logger.warning("kv events queue full: %d batches dropped, AllBlocksCleared sent instead", dropped + 1)
            self._send(KVEventBatch(time.time(), [AllBlocksCleared()], self.data_parallel_rank))
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return
            if batch is not None:
                self._send(batch)
            self._handled += 1

    def _send(self, batch: KVEventBatch) -> None:
        payload = encode_batch(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # no subscriber keeps up (hwm): the replay buffer still has it
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) < 3 or len(frames[-1]) != 8:
            logger.warning("kv events replay: malformed request (%d frames) ignored", len(frames))
            return
        client = frames[0]
        start = int.from_bytes(frames[-1], "big", signed=True)
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart((client, b"", seq_bytes(seq), payload))
        self._replay.send_multipart((client, b"", seq_bytes(END_SEQ), b""))
