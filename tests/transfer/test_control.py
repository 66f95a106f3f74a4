"""Control channel: typed dispatch, errors as replies, timeouts instead of hangs."""

from __future__ import annotations

import socket
import threading
import time

import msgspec
import pytest
import zmq
from transfer_harness import make_caps, make_pool

from execstate.transfer.control import (
    Ack,
    ControlClient,
    ControlServer,
    ErrorReply,
    GetManifest,
    Hello,
    HelloReply,
    Release,
)
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.manifest import Manifest

CAPS = make_caps("P", make_pool(2))


class Handler:
    def __init__(self) -> None:
        self.calls: list[object] = []
        self.sleep_s = 0.0

    def on_hello(self, msg: Hello) -> HelloReply:
        self.calls.append(msg)
        return HelloReply(CAPS)

    def on_get_manifest(self, msg: GetManifest) -> Manifest | ErrorReply:
        self.calls.append(msg)
        time.sleep(self.sleep_s)
        if msg.transfer_id == "boom":
            raise RuntimeError("handler bug")
        if msg.transfer_id == "ack":
            return Ack()  # type: ignore[return-value]  # a confused peer
        return ErrorReply(ErrorCode.UNKNOWN_TRANSFER, f"no {msg.transfer_id}")

    def on_release(self, msg: Release) -> Ack:
        self.calls.append(msg)
        return Ack()


@pytest.fixture
def server():
    handler = Handler()
    srv = ControlServer("127.0.0.1", 0, handler)
    yield srv, handler
    srv.close()


def test_typed_requests_and_replies(server) -> None:
    srv, handler = server
    client = ControlClient(srv.addr, 2.0)
    assert client.hello(CAPS) == CAPS
    client.release("t1")
    with pytest.raises(TransferError) as e:
        client.get_manifest("t9", 0)
    assert e.value.code is ErrorCode.UNKNOWN_TRANSFER and "no t9" in str(e.value)
    assert handler.calls == [Hello(CAPS), Release("t1"), GetManifest("t9", 0)]
    assert client.bytes_sent == srv.bytes_in > 0 and client.bytes_received == srv.bytes_out > 0
    client.close()


def test_bad_request_and_handler_bug_keep_the_server_alive(server) -> None:
    srv, _ = server
    client = ControlClient(srv.addr, 2.0)
    with pytest.raises(TransferError) as e:
        client.get_manifest("boom", 0)
    assert e.value.code is ErrorCode.INTERNAL and "handler bug" in str(e.value)
    with pytest.raises(TransferError, match="^protocol: expected Manifest, got Ack"):
        client.get_manifest("ack", 0)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(srv.addr)
    for payload in (
        b"not msgpack \xc1",
        msgspec.msgpack.encode({"type": "Ack"}),
        msgspec.msgpack.encode({"type": "Exec", "cmd": "rm"}),
    ):
        raw.send_multipart([b"", payload])
        assert raw.poll(2000)
        reply = msgspec.msgpack.decode(raw.recv_multipart()[-1], type=ErrorReply)
        assert reply.code is ErrorCode.BAD_REQUEST
    raw.close()
    assert client.hello(CAPS) == CAPS  # still serving


def test_dead_peer_times_out_never_hangs() -> None:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ControlClient(f"tcp://127.0.0.1:{port}", 0.3)
    t0 = time.monotonic()
    with pytest.raises(TransferError) as e:
        client.hello(CAPS)
    assert e.value.code is ErrorCode.TIMEOUT and 0.3 <= time.monotonic() - t0 < 1.0
    client.close()


def test_late_reply_is_never_taken_for_the_next_one(server) -> None:
    srv, handler = server
    client = ControlClient(srv.addr, 0.2)
    handler.sleep_s = 0.5
    with pytest.raises(TransferError) as e:
        client.get_manifest("slow", 0)
    assert e.value.code is ErrorCode.TIMEOUT
    handler.sleep_s = 0.0
    time.sleep(0.4)  # the late reply to "slow" is sent now, to a socket that no longer exists
    client.timeout_s = 2.0
    assert client.hello(CAPS) == CAPS
    client.close()


def test_server_serves_clients_on_several_threads(server) -> None:
    srv, handler = server
    errors: list[BaseException] = []

    def run() -> None:
        try:
            c = ControlClient(srv.addr, 2.0)
            for _ in range(20):
                assert c.hello(CAPS) == CAPS
            c.close()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(handler.calls) == 80


def test_bind_error_surfaces(server) -> None:
    srv, _ = server
    with pytest.raises(zmq.ZMQError):
        ControlServer("127.0.0.1", srv.port, Handler())
