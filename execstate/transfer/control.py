"""Control channel: small typed request/reply messages over ZeroMQ (docs/contracts.md 5).

Messages are ``msgspec`` Structs of one tagged union, dispatched by type (never by a method-name
string). Requests and their replies:

=====================================  ==========================================
``Hello(caps)``                        ``HelloReply(caps)``
``GetManifest(transfer_id, epoch)``    ``Manifest`` or ``ErrorReply(code, message)``
``Release(transfer_id)``               ``Ack`` or ``ErrorReply``
=====================================  ==========================================

:class:`ControlServer` binds a ROUTER socket and serves it on its own background thread, calling
the :class:`ControlHandler`'s typed methods **on that thread** (the handler must be thread-safe
with respect to its owner's thread). A handler exception becomes ``ErrorReply(INTERNAL)``; a
malformed request ``ErrorReply(BAD_REQUEST)``; the server keeps serving.

:class:`ControlClient` (one thread only) uses a DEALER socket and a deadline per request: a dead
or silent peer raises ``TransferError(TIMEOUT)`` within ``timeout_s``, never a hang. After a
timeout the socket is discarded, so a late reply can never be read as the answer to a later
request. Both sides cap message size at ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import zmq
from msgspec import Struct

from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.manifest import MAX_MESSAGE_BYTES, Capabilities, Decoder, Manifest, encode

_POLL_MS = 50  # server's stop-flag check interval


class Hello(Struct, frozen=True, tag=True):
    caps: Capabilities


class HelloReply(Struct, frozen=True, tag=True):
    caps: Capabilities


class GetManifest(Struct, frozen=True, tag=True):
    transfer_id: str
    epoch: int


class Release(Struct, frozen=True, tag=True):
    transfer_id: str


class Ack(Struct, frozen=True, tag=True):
    pass


class ErrorReply(Struct, frozen=True, tag=True):
    code: ErrorCode
    message: str


Request = Hello | GetManifest | Release
Reply = HelloReply | Manifest | ErrorReply | Ack
R = TypeVar("R")
ReplyFilter = Callable[[bytes], bytes | None]
"""Applied by the client to each raw reply before decoding; ``None`` drops it (fault injection)."""


class ControlHandler(Protocol):
    """Server-side logic; every method runs on the server thread and returns the reply."""

    def on_hello(self, msg: Hello) -> HelloReply | ErrorReply: ...

    def on_get_manifest(self, msg: GetManifest) -> Manifest | ErrorReply: ...

    def on_release(self, msg: Release) -> Ack | ErrorReply: ...


def _dispatch(handler: ControlHandler, msg: Request) -> Reply:
    match msg:
        case Hello():
            return handler.on_hello(msg)
        case GetManifest():
            return handler.on_get_manifest(msg)
        case Release():
            return handler.on_release(msg)
    raise AssertionError(f"unhandled request type {type(msg).__name__}")


class ControlServer:
    """ROUTER socket on ``tcp://bind_host:port`` (``port=0``: any free port, see :attr:`port`).

    Construction binds and starts the thread (bind errors raise here); :meth:`close` stops and
    joins it. Counters ``bytes_in`` / ``bytes_out`` / ``num_requests`` are written by the thread.
    """

    def __init__(self, bind_host: str, port: int, handler: ControlHandler) -> None:
        self._handler = handler
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port: int = 0
        self.bind_host = bind_host
        self.bytes_in = 0
        self.bytes_out = 0
        self.num_requests = 0
        self._thread = threading.Thread(target=self._run, args=(port,), name="execstate-control", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    @property
    def addr(self) -> str:
        """``tcp://host:port`` for :class:`ControlClient`."""
        return f"tcp://{self.bind_host}:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, port: int) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            if port == 0:
                self.port = sock.bind_to_random_port(f"tcp://{self.bind_host}")
            else:
                sock.bind(f"tcp://{self.bind_host}:{port}")
                self.port = port
        except BaseException as e:  # surfaced to the constructor
            self._error = e
            sock.close()
            self._ready.set()
            return
        self._ready.set()
        decoder: Decoder[Request] = Decoder(Request)
        try:
            while not self._stop.is_set():
                if not sock.poll(_POLL_MS):
                    continue
                frames = sock.recv_multipart()
                if len(frames) < 2:
                    continue
                identity, envelope, payload = frames[0], frames[1:-1], frames[-1]
                self.bytes_in += len(payload)
                self.num_requests += 1
                reply = self._serve(decoder, payload)
                self.bytes_out += len(reply)
                sock.send_multipart([identity, *envelope, reply])
        finally:
            sock.close()

    def _serve(self, decoder: Decoder[Request], payload: bytes) -> bytes:
        try:
            msg = decoder.decode(payload)
        except TransferError as e:
            return encode(ErrorReply(ErrorCode.BAD_REQUEST, e.detail))
        try:
            return encode(_dispatch(self._handler, msg))
        except Exception as e:  # a handler bug must not take the channel down
            return encode(ErrorReply(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}"))


class ControlClient:
    """Request/reply client of one :class:`ControlServer`; use from one thread only.

    Typed calls raise ``TransferError``: ``TIMEOUT`` (no reply in ``timeout_s``), ``PROTOCOL``
    (malformed or unexpected reply) or the code of the server's ``ErrorReply``. Counters
    ``bytes_sent`` / ``bytes_received`` count payload bytes of every exchange.
    """

    def __init__(self, addr: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.addr = addr
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self.bytes_received = 0
        self._sock: zmq.Socket | None = None
        self._decoder: Decoder[Reply] = Decoder(Reply)

    def hello(self, caps: Capabilities) -> Capabilities:
        """The server's capabilities (the caller checks compatibility)."""
        return self._expect(self.request(Hello(caps)), HelloReply).caps

    def get_manifest(self, transfer_id: str, epoch: int, reply_filter: ReplyFilter | None = None) -> Manifest:
        return self._expect(self.request(GetManifest(transfer_id, epoch), reply_filter), Manifest)

    def release(self, transfer_id: str) -> None:
        self._expect(self.request(Release(transfer_id)), Ack)

    def request(self, msg: Request, reply_filter: ReplyFilter | None = None) -> Reply:
        """Send ``msg``; return the decoded reply (an ``ErrorReply`` is returned, not raised)."""
        deadline = time.monotonic() + self.timeout_s
        sock = self._socket()
        payload = encode(msg)
        try:
            sock.send_multipart([b"", payload])
        except zmq.Again:
            self._reset()
            raise TransferError(
                ErrorCode.TIMEOUT, f"could not send {type(msg).__name__} to {self.addr}"
            ) from None
        self.bytes_sent += len(payload)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._reset()
                raise TransferError(
                    ErrorCode.TIMEOUT,
                    f"no reply to {type(msg).__name__} from {self.addr} within {self.timeout_s} s",
                )
            if not sock.poll(math.ceil(remaining * 1000)):
                continue  # re-check the deadline (poll may wake a little early)
            raw = sock.recv_multipart()[-1]
            self.bytes_received += len(raw)
            data = raw if reply_filter is None else reply_filter(raw)
            if data is None:
                continue  # dropped: keep waiting until the deadline
            if time.monotonic() > deadline:
                self._reset()
                raise TransferError(
                    ErrorCode.TIMEOUT,
                    f"reply to {type(msg).__name__} from {self.addr} after {self.timeout_s} s",
                )
            try:
                return self._decoder.decode(data)
            except TransferError:
                self._reset()
                raise

    def close(self) -> None:
        self._reset()

    def _expect(self, reply: Reply, kind: type[R]) -> R:
        if isinstance(reply, ErrorReply):
            raise TransferError(reply.code, f"{self.addr}: {reply.message}")
        if not isinstance(reply, kind):
            raise TransferError(ErrorCode.PROTOCOL, f"expected {kind.__name__}, got {type(reply).__name__}")
        return reply

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout_s * 1000)))
            sock.connect(self.addr)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
