"""The realtime framework's claim (``execstate/serve/realtime/__init__.py``): a new protocol takes one
file of structs and one file of handlers. ``echo`` below is such a protocol, written entirely in this
file (its structs and phases, then its handlers), mounted on an app and driven over a real WebSocket
(uvicorn and the ``websockets`` client): the limits, the errors, the phase checks, the back-pressure,
the authentication and the close handling all come from the framework."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from fastapi import FastAPI
from serve_helpers import running_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from execstate.serve.auth import APIKeyMiddleware
from execstate.serve.realtime.connection import Connection, Peer
from execstate.serve.realtime.endpoint import Endpoint, mount
from execstate.serve.realtime.errors import EventId, ProtocolError
from execstate.serve.realtime.limits import Limits
from execstate.serve.realtime.messages import Message, MessageTable, Renamed, server_event
from execstate.serve.realtime.outbox import CloseFrame, Outbox
from execstate.serve.realtime.phases import Move, Phase, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol
from execstate.session.runtime.events import SessionEventError

# -- "messages.py" of the echo protocol -------------------------------------------------------------


class Open(Message, tag="open"):
    name: str
    event_id: EventId = None


class Say(Message, tag="say"):
    text: str
    event_id: EventId = None


class Flood(Message, tag="flood"):
    count: int
    size: int = 0
    event_id: EventId = None


class Fail(Message, tag="fail"):
    how: Literal["protocol", "session", "bug"]
    event_id: EventId = None


class Slow(Message, tag="slow"):
    seconds: float
    event_id: EventId = None


class Close(Message, tag="close"):
    event_id: EventId = None


IDLE = Phase("idle", allow=frozenset({"open"}), otherwise=Refusal("not_open", "{type}: send open first"))
OPENED = Phase("opened", refuse={"open": Refusal("already_open", "{type}: {name!r} is open already")})
OPEN = Move("open", frozenset({IDLE}), OPENED, strict=True)
CLOSE = Move("close", None, IDLE)
ECHO = RealtimeProtocol(
    "echo", MessageTable(Open, Say, Flood, Fail, Slow, Close),
    PhaseTable(IDLE, (IDLE, OPENED), (OPEN, CLOSE), values=("name",)),
    Limits(max_message_bytes=1024, max_unprocessed_messages=8, max_unprocessed_bytes=4096, max_unsent_events=4),
)

# -- "handlers.py" of the echo protocol -------------------------------------------------------------


class Log:
    """What the handlers did (the tests read it from the server's thread)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.flooded = 0


class EchoHandlers:
    def __init__(self, peer: Peer, log: Log) -> None:
        self.peer = peer
        self.log = log
        self.routes = {Open: self.open, Say: self.say, Flood: self.flood, Fail: self.fail, Slow: self.slow,
                       Close: self.close_msg}

    async def open(self, msg: Open) -> None:
        self.peer.state.move(OPEN, name=msg.name)
        await self.peer.emit(server_event("opened", msg.event_id, name=msg.name))

    async def say(self, msg: Say) -> None:
        await self.peer.emit(server_event("said", msg.event_id, text=msg.text))

    async def flood(self, msg: Flood) -> None:
        for i in range(msg.count):
            await self.peer.emit_binary(server_event("item", msg.event_id, i=i), bytes([i % 256]) * msg.size)
            self.log.flooded = i + 1

    async def fail(self, msg: Fail) -> None:
        if msg.how == "protocol":
            raise ProtocolError("nope", "refused by the handler", "inner")
        if msg.how == "session":
            raise SessionEventError("busy", "the session is stepping")
        raise KeyError("a bug")

    async def slow(self, msg: Slow) -> None:
        self.log.events.append("slow started")
        await asyncio.sleep(msg.seconds)
        self.log.events.append("slow finished")
        await self.peer.emit(server_event("slept", msg.event_id))

    async def close_msg(self, msg: Close) -> None:
        self.peer.state.move(CLOSE)
        await self.peer.emit(server_event("closed", msg.event_id))

    async def close(self) -> None:
        self.log.events.append("closed")


def install_echo(app: FastAPI, log: Log) -> Endpoint:
    return mount(app, "/v1/echo", Endpoint(ECHO, lambda peer: EchoHandlers(peer, log)))


# -- the tests --------------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(api_key: str | None = None) -> Iterator[tuple[str, Log, Endpoint]]:
    app = FastAPI()
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    log = Log()
    endpoint = install_echo(app, log)
    with running_server(app) as (url, _):
        yield url.replace("http://", "ws://") + "/v1/echo", log, endpoint


@pytest.fixture(scope="module")
def echo() -> Iterator[tuple[str, Log, Endpoint]]:
    with serving() as s:
        yield s


async def ask(ws: Any, msg: dict[str, Any] | str | bytes) -> dict[str, Any]:
    await ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)
    return json.loads(await asyncio.wait_for(ws.recv(), 30))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(pred: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


def code(event: dict[str, Any]) -> tuple[str, Any]:
    assert event["type"] == "error", event
    return event["error"]["code"], event["event_id"]


def test_phases_and_errors_come_from_the_framework(echo):
    url, _, _ = echo

    async def main():
        async with connect(url) as ws:
            assert code(await ask(ws, {"type": "say", "text": "hi", "event_id": 1})) == ("not_open", 1)
            assert code(await ask(ws, "{")) == ("invalid_message", None)
            assert code(await ask(ws, {"type": "shout", "event_id": "s"})) == ("unknown_type", "s")
            assert code(await ask(ws, {"type": "say", "event_id": 2})) == ("invalid_message", 2)  # text missing
            assert code(await ask(ws, {"type": "say", "text": "x", "loud": True, "event_id": 3})) == (
                "invalid_message", 3)
            assert code(await ask(ws, b"\x00\x01")) == ("invalid_message", None)
            too_big = await ask(ws, {"type": "say", "text": "x" * 2000, "event_id": 4})
            assert code(too_big) == ("message_too_large", None) and "1024 bytes" in too_big["error"]["message"]
            assert await ask(ws, {"type": "open", "name": "a", "event_id": 5}) == {
                "type": "opened", "event_id": 5, "name": "a"}
            again = await ask(ws, {"type": "open", "name": "b", "event_id": 6})
            assert code(again) == ("already_open", 6) and again["error"]["message"] == "open: 'a' is open already"
            assert code(await ask(ws, {"type": "fail", "how": "protocol", "event_id": 7})) == ("nope", "inner")
            assert code(await ask(ws, {"type": "fail", "how": "session", "event_id": 8})) == ("busy", 8)
            bug = await ask(ws, {"type": "fail", "how": "bug", "event_id": 9})
            assert code(bug) == ("server_error", 9) and bug["error"]["type"] == "server_error"
            assert "KeyError" in bug["error"]["message"]
            # none of it broke the connection
            assert await ask(ws, {"type": "say", "text": "still here", "event_id": 10}) == {
                "type": "said", "event_id": 10, "text": "still here"}
            assert (await ask(ws, {"type": "close"}))["type"] == "closed"
            assert code(await ask(ws, {"type": "say", "text": "hi"})) == ("not_open", None)

    run(main())


def test_too_many_unprocessed_messages_close_the_connection_with_1008(echo):
    url, log, endpoint = echo

    async def main():
        await until(lambda: endpoint.num_connections == 0)  # earlier tests' connections are closed
        log.events.clear()
        async with connect(url) as ws:
            await ask(ws, {"type": "open", "name": "x"})
            await ws.send(json.dumps({"type": "slow", "seconds": 1.0}))
            for _ in range(ECHO.limits.max_unprocessed_messages + 4):
                await ws.send(json.dumps({"type": "say", "text": "x"}))
            events = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
            assert [e for e in events if e["type"] == "error"] == [events[-1]]
            assert code(events[-1]) == ("too_many_messages", None)
            assert events[-1]["error"]["message"] == (
                "more than 8 messages or 4096 bytes are waiting to be processed; closing the connection")
        await until(lambda: endpoint.num_connections == 0)
        assert log.events == ["slow started", "slow finished", "closed"]

    run(main())


def test_a_client_that_does_not_read_only_slows_itself(echo):
    """With at most 4 unsent events, a flood stops while its client does not read, another client
    is served meanwhile, and the flood finishes, in order, each payload right after its event."""
    url, log, _ = echo
    count, size = 400, 64 << 10  # far more than the socket buffers hold

    async def main():
        # a small receive buffer and no compression, so the network does not hold the whole flood
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # before connecting: the window
        sock.connect(("127.0.0.1", int(url.split(":")[2].split("/")[0])))
        async with connect(url, sock=sock, max_size=None, max_queue=4, compression=None) as slow, \
                connect(url) as other:
            await ask(slow, {"type": "open", "name": "slow"})
            await slow.send(json.dumps({"type": "flood", "count": count, "size": size, "event_id": "f"}))
            await until(lambda: log.flooded > 0)
            await asyncio.sleep(0.5)
            stalled = log.flooded
            assert stalled < count  # the handler waits for its client
            assert (await ask(other, {"type": "open", "name": "other"}))["type"] == "opened"
            assert log.flooded < count
            for i in range(count):
                event = json.loads(await asyncio.wait_for(slow.recv(), 30))
                assert event == {"type": "item", "event_id": "f", "i": i}
                assert await asyncio.wait_for(slow.recv(), 30) == bytes([i % 256]) * size
            assert log.flooded == count

    run(main())


def test_a_disconnect_finishes_the_message_in_hand_then_closes_once(echo):
    url, log, endpoint = echo

    async def main():
        await until(lambda: endpoint.num_connections == 0)
        log.events.clear()
        async with connect(url) as ws:
            await ask(ws, {"type": "open", "name": "x"})
            await ws.send(json.dumps({"type": "slow", "seconds": 0.3}))
            await ws.send(json.dumps({"type": "say", "text": "dropped"}))
            await until(lambda: "slow started" in log.events)
        await until(lambda: endpoint.num_connections == 0)
        assert log.events == ["slow started", "slow finished", "closed"]

    run(main())


def test_the_apps_api_key_guards_the_socket_and_the_subprotocol_is_chosen():
    with serving(api_key="key-one-1") as (url, _, _):
        async def main():
            with pytest.raises(InvalidStatus) as info:
                async with connect(url):
                    pass
            assert info.value.response.status_code == 401
            async with connect(url, subprotocols=["realtime", "openai-insecure-api-key.key-one-1"]) as ws:
                assert ws.subprotocol == "realtime"
                assert (await ask(ws, {"type": "open", "name": "a"}))["type"] == "opened"
            async with connect(url, additional_headers={"Authorization": "Bearer key-one-1"}) as ws:
                assert ws.subprotocol is None
                assert code(await ask(ws, {"type": "say", "text": "x"})) == ("not_open", None)

        run(main())


def test_handlers_must_route_every_message_of_their_protocol():
    class Partial:
        def __init__(self, peer: Peer) -> None:
            self.routes = {Open: self.open}

        async def open(self, msg: Open) -> None: ...

        async def close(self) -> None: ...

    async def emit(event: dict[str, Any]) -> None: ...

    with pytest.raises(ValueError, match="Close.*Fail.*Flood.*Say.*Slow"):
        Connection(ECHO, Partial, emit)


def test_a_renamed_type_decodes_as_the_new_message_and_is_checked_like_it():
    table = MessageTable(Open, Say, renamed=(Renamed("start", Open, {"opened": "started"}),))
    msg, renamed = table.read('{"type": "start", "name": "a", "event_id": 3}', 1 << 10)
    assert type(msg) is Open and (msg.name, msg.event_id) == ("a", 3)
    assert renamed is not None and renamed.answers == {"opened": "started"}
    assert table.read('{"type": "open", "name": "a"}', 1 << 10)[1] is None
    assert table.types == ("open", "say")  # the former name is accepted, never offered
    bad = pytest.raises(ProtocolError, table.decode, '{"type": "start", "nam": "a", "event_id": 1}', 1 << 10).value
    assert (bad.code, bad.event_id) == ("invalid_message", 1) and bad.message.startswith("start:")
    unknown = pytest.raises(ProtocolError, table.decode, '{"type": "begin"}', 1 << 10).value
    assert unknown.code == "unknown_type" and "start" not in unknown.message
    with pytest.raises(ValueError, match="distinct"):
        MessageTable(Open, Say, renamed=(Renamed("say", Open),))
    with pytest.raises(ValueError, match="new struct"):
        MessageTable(Say, renamed=(Renamed("start", Open),))


def test_the_outbox_bounds_its_producers_and_keeps_order():
    async def main():
        box: Outbox[int] = Outbox(2)
        await box.put(1)
        await box.put(2)
        third = asyncio.create_task(box.put(3))
        await asyncio.sleep(0.05)
        assert not third.done()  # back-pressure: the producer waits
        assert await box.get() == 1
        await asyncio.wait_for(third, 1)
        await box.close_with(4, 1008, "bye")
        await box.put(5)  # dropped: the outbox stopped accepting
        assert [await box.get() for _ in range(4)] == [2, 3, 4, CloseFrame(1008, "bye")]
        assert await box.get() is None
        blocked = Outbox[int](1)
        await blocked.put(1)
        waiting = asyncio.create_task(blocked.put(2))
        await asyncio.sleep(0.05)
        await blocked.abandon()  # the socket went: waiting producers are released, nothing is kept
        await asyncio.wait_for(waiting, 1)
        assert await blocked.get() is None

    run(main())
