"""A world connection without a server (the framework's ``Connection`` with ``WorldHandlers``): after
a rollback, the key the connection counts as held is the session runtime's (the checkpoint's held
key with its pending events), so ``key.up`` is accepted or refused as the restored state says."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from world_serve_helpers import tiny_world_model

from execstate.serve.realtime.connection import Connection
from execstate.serve.realtime.world.handlers import WorldHandlers
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL


@pytest.fixture(scope="module")
def host():
    h = WorldHost(tiny_world_model(), max_sessions=1, default_fps=0)
    yield h
    h.shutdown()


class Wire:
    def __init__(self, host: WorldHost) -> None:
        self.events: list[dict[str, Any]] = []
        self.conn = Connection(WORLD_PROTOCOL, lambda peer: WorldHandlers(peer, host), self._emit, self._emit_chunk)

    async def _emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    async def _emit_chunk(self, meta: dict[str, Any], payload: bytes) -> None:
        self.events.append(meta)

    async def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``msg`` (the first event after it that is not a chunk)."""
        n = len(self.events)
        await self.conn.handle(json.dumps(msg))
        return next(e for e in self.events[n:] if e["type"] not in ("video.chunk_metadata", "session.behind"))


def test_key_held_after_a_rollback_is_the_runtimes(host):
    async def main():
        w = Wire(host)
        await w.ask({"type": "session.create", "seed": 2, "fps": 0})
        assert (await w.ask({"type": "session.pause"}))["type"] == "session.paused"
        cp0 = (await w.ask({"type": "session.checkpoint"}))["checkpoint_id"]  # nothing held, nothing pending
        assert (await w.ask({"type": "key.down", "key": "up", "event_id": "d1"}))["type"] == \
            "session.interaction.queued"
        cp1 = (await w.ask({"type": "session.checkpoint"}))["checkpoint_id"]  # the key.down pending in it
        assert (await w.ask({"type": "key.up", "key": "up", "event_id": "u1"}))["type"] == "session.interaction.queued"
        refused = await w.ask({"type": "key.up", "key": "up", "event_id": "u2"})
        assert (refused["code"], refused["event_id"]) == ("key_not_held", "u2")
        rb = await w.ask({"type": "session.rollback", "checkpoint_id": cp1})
        assert rb["type"] == "session.rolled_back"
        assert (await w.ask({"type": "key.up", "key": "up", "event_id": "u3"}))["type"] == "session.interaction.queued"
        await w.ask({"type": "session.rollback", "checkpoint_id": cp0})
        refused = await w.ask({"type": "key.up", "key": "up", "event_id": "u4"})
        assert refused["type"] == "error" and refused["code"] == "key_not_held"
        await w.ask({"type": "session.rollback", "checkpoint_id": cp1})
        await w.ask({"type": "session.unpause"})
        while not any(e["type"] == "video.chunk_metadata" and e["keys"] == ["up", "up"] for e in w.events):
            await asyncio.sleep(0.01)  # the restored key.down applies at the next boundary
        assert (await w.ask({"type": "session.close"}))["type"] == "session.closed"
        await w.conn.close()
        assert host.num_sessions == 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_deprecated_names_work_for_one_release(host):
    """The world's former names (``session.start``, ``session.resume``, ``session.stop``) are acted on
    as ``session.create``, ``session.unpause``, ``session.close``, and a connection that used them gets
    the former answers (``session.resumed``, ``session.done``); a current client gets the current ones."""

    async def main():
        old = Wire(host)
        started = await old.ask({"type": "session.start", "event_id": "s", "seed": 2, "fps": 0})
        assert (started["type"], started["event_id"]) == ("video.start", "s")
        assert (await old.ask({"type": "session.pause", "event_id": "p"}))["type"] == "session.paused"
        resumed = await old.ask({"type": "session.resume", "event_id": "r"})
        assert (resumed["type"], resumed["event_id"]) == ("session.resumed", "r")
        refused = await old.ask({"type": "session.resume", "event_id": "r2"})  # the phase knows it as unpause
        assert (refused["type"], refused["code"], refused["event_id"]) == ("error", "not_paused", "r2")
        done = await old.ask({"type": "session.stop", "event_id": "x"})
        assert (done["type"], done["event_id"], done["stopped"]) == ("session.done", "x", True)
        bad = await old.ask({"type": "session.start", "event_id": "b", "sead": 1})  # a field typo, not a type
        assert (bad["code"], bad["event_id"]) == ("invalid_message", "b")
        assert bad["message"].startswith("session.start:")
        # num_frames reached: the session's end is named as the client named its start
        n = len(old.events)
        await old.ask({"type": "session.start", "seed": 2, "fps": 0, "num_frames": 2})
        while not any(e["type"] in ("session.done", "session.closed") for e in old.events[n:]):
            await asyncio.sleep(0.01)
        assert old.events[-1]["type"] == "session.done" and old.events[-1]["stopped"] is False
        await old.conn.close()

        new = Wire(host)
        assert (await new.ask({"type": "session.create", "seed": 2, "fps": 0}))["type"] == "video.start"
        await new.ask({"type": "session.pause"})
        assert (await new.ask({"type": "session.unpause"}))["type"] == "session.unpaused"
        closed = await new.ask({"type": "session.close", "event_id": "c"})
        assert (closed["type"], closed["event_id"], closed["stopped"]) == ("session.closed", "c", True)
        unknown = await new.ask({"type": "session.begin", "event_id": "u"})
        assert unknown["code"] == "unknown_type" and "session.start" not in unknown["message"]
        await new.conn.close()
        assert host.num_sessions == 0

    asyncio.run(asyncio.wait_for(main(), 60))
