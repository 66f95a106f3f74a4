"""The ZeroMQ client that keeps one :class:`ReplicaIndex` per replica current (docs/fleet.md).

:class:`EventSubscriber` owns one thread and, per replica (:meth:`watch`: its PUB endpoint and
replay endpoint), a SUB socket. Each batch received is applied to the replica's index under the
subscriber's lock (:meth:`index` hands out the index; read it under :meth:`locked`). A batch
whose sequence number is not the next one (the subscriber joined late, or the PUB socket dropped
some) triggers a replay request (a DEALER socket to the replay endpoint, from the expected
sequence number); batches the publisher no longer buffers are lost: the index is reset at the
first batch it still has (it may then miss blocks, never claim one the replica dropped).
:meth:`unwatch` forgets a replica; :meth:`close` stops the thread (idempotent).

A replica's feed on a non-loopback address is a CURVE server keyed by the instances' shared ring
(``state/kv_events/auth.py``); the subscriber connects to it as a CURVE client of ``ring``
(default: ``$EXECSTATE_KV_SECRET``), and cannot follow it without one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import zmq

from execstate.fleet.router.block_index import ReplicaIndex, SequenceGap
from execstate.identity.secret_ring import SECRET_ENV, SecretRing
from execstate.state.kv_events.auth import is_loopback, secure_client
from execstate.state.kv_events.events import decode_batch

logger = logging.getLogger("execstate.fleet")
_POLL_MS = 20
REPLAY_TIMEOUT_MS = 2000


@dataclass
class _Watched:
    endpoint: str
    replay_endpoint: str | None
    socket: zmq.Socket
    index: ReplicaIndex


class EventSubscriber:
    def __init__(self, ring: SecretRing | None = None) -> None:
        self.ring = ring if ring is not None else SecretRing.resolve()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._lock = threading.RLock()
        self._watched: dict[str, _Watched] = {}
        self._changes: list[tuple[str, _Watched | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="execstate-kv-subscriber", daemon=True)
        self._thread.start()

    def watch(self, replica_id: str, endpoint: str, replay_endpoint: str | None) -> None:
        """Follow ``replica_id``'s events (again from seq 0 via replay when its endpoint changed)."""
        with self._lock:
            current = self._watched.get(replica_id)
            if current is not None and current.endpoint == endpoint:
                return
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            self._secure(sock, endpoint)
            sock.connect(endpoint)
            w = _Watched(endpoint, replay_endpoint, sock, ReplicaIndex())
            self._changes.append((replica_id, w))
            self._watched[replica_id] = w
            if current is not None:
                self._changes.append(("", current))  # its old socket is closed on the thread

    def _secure(self, sock: zmq.Socket, endpoint: str) -> None:
        if is_loopback(endpoint):
            return
        if self.ring is None:
            logger.warning("kv events at %s are served with CURVE keys of the shared secret, which this router "
                           "does not have (%s): it cannot follow them", endpoint, SECRET_ENV)
            return
        secure_client(sock, self.ring)

    def unwatch(self, replica_id: str) -> None:
        with self._lock:
            w = self._watched.pop(replica_id, None)
            if w is not None:
                self._changes.append(("", w))

    def watching(self) -> list[str]:
        with self._lock:
            return list(self._watched)

    def index(self, replica_id: str) -> ReplicaIndex | None:
        with self._lock:
            w = self._watched.get(replica_id)
            return None if w is None else w.index

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock while reading indexes (the thread applies batches under it)."""
        with self._lock:
            yield

    def catch_up(self, replica_id: str) -> int:
        """Ask the replay socket for every batch after the index's last one (any thread; tests and
        a router that wants a fresh view); the number applied."""
        with self._lock:
            w = self._watched.get(replica_id)
            if w is None:
                return 0
            return self._replay(w, w.index.next_seq)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for w in self._watched.values():
                w.socket.close(0)
            for _, gone in self._changes:
                if gone is not None:
                    gone.socket.close(0)
            self._watched.clear()
            self._changes.clear()

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        owners: dict[zmq.Socket, str] = {}
        while not self._stop.is_set():
            with self._lock:
                for rid, w in self._changes:
                    if rid and w is not None:  # an addition ("", w: a removal)
                        poller.register(w.socket, zmq.POLLIN)
                        owners[w.socket] = rid
                    elif w is not None and w.socket in owners:
                        poller.unregister(w.socket)
                        del owners[w.socket]
                        w.socket.close(0)
                self._changes.clear()
            if not owners:
                self._stop.wait(_POLL_MS / 1000)
                continue
            for sock, _ in poller.poll(_POLL_MS):
                with self._lock:
                    owner = owners.get(sock)
                    w = self._watched.get(owner) if owner is not None else None
                    if owner is None or w is None or w.socket is not sock:
                        sock.recv_multipart()  # a replica forgotten meanwhile
                        continue
                    self._receive(owner, w)

    def _receive(self, replica_id: str, w: _Watched) -> None:
        _, seq_b, payload = w.socket.recv_multipart()
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq < w.index.next_seq:
            return  # already applied (from a replay)
        if seq > w.index.next_seq:
            self._replay(w, w.index.next_seq)
            if seq < w.index.next_seq:
                return
        try:
            w.index.apply(seq, decode_batch(payload))
        except SequenceGap:
            logger.warning("kv events of %s: batches %d..%d are lost; its index starts over",
                           replica_id, w.index.next_seq, seq - 1)
            w.index.reset(seq)
            w.index.apply(seq, decode_batch(payload))
        except ValueError:
            logger.exception("kv events of %s: a malformed batch %d; its index starts over", replica_id, seq)
            w.index.reset(seq + 1)

    def _replay(self, w: _Watched, start: int) -> int:
        """Apply the buffered batches from ``start`` on (lock held); the number applied."""
        if w.replay_endpoint is None:
            return 0
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, REPLAY_TIMEOUT_MS)
        self._secure(sock, w.replay_endpoint)
        applied = 0
        try:
            sock.connect(w.replay_endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            while True:
                _, seq_b, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_b, "big", signed=True)
                if seq < 0:
                    return applied
                if seq < w.index.next_seq:
                    continue
                if seq > w.index.next_seq:
                    w.index.reset(seq)  # the publisher no longer buffers what came before
                w.index.apply(seq, decode_batch(payload))
                applied += 1
        except zmq.Again:
            logger.warning("kv events replay from %s timed out", w.replay_endpoint)
            return applied
        finally:
            sock.close(0)
