"""Malformed and out-of-order message streams on a world connection (no server: the connection
object itself): never a crash or an internal error, every error names its problem and carries the
offending message's event id, and another session on the same host streams the same frames as
without the noise."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from world_serve_helpers import offline_hashes, tiny_world_model

from execstate.serve.realtime.connection import Connection
from execstate.serve.realtime.world.handlers import WorldHandlers
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=6)
EVENT_ID = st.none() | st.integers(-2, 50) | st.text(max_size=4) | st.booleans()
KEY = st.sampled_from(["up", "down", "left", "right", "none", "jump", ""])
TYPES = ["session.create", "session.interaction", "key.down", "key.up", "session.pause", "session.unpause",
         "session.checkpoint", "session.rollback", "checkpoint.release", "session.ping", "session.close"]


def message(draw_type, event_id, key, payload, fps, num_frames):
    msg = {"type": draw_type, "event_id": event_id}
    if draw_type == "session.create":
        msg |= {"fps": fps, "num_frames": num_frames, "seed": 1}
    elif draw_type in ("key.down", "key.up"):
        msg["key"] = key
    elif draw_type == "session.interaction":
        msg["interaction"] = payload
    elif draw_type in ("session.rollback", "checkpoint.release"):
        msg["checkpoint_id"] = payload if isinstance(payload, str) else "cp-0"
    if event_id is None:
        del msg["event_id"]
    return json.dumps(msg)


INTERACTION = st.one_of(
    JSON,
    st.fixed_dictionaries({"event": st.fixed_dictionaries({"prompt": st.text(max_size=6) | st.none()})}),
    st.fixed_dictionaries({"event_id": st.text(max_size=3), "event": st.fixed_dictionaries({"multi_modal_data": (
        st.fixed_dictionaries({"action": st.fixed_dictionaries({"data": st.fixed_dictionaries({"keys": st.lists(
            KEY, max_size=2)})})}) | st.fixed_dictionaries({"camera": JSON}))})}),
)
FRAME = st.one_of(
    st.builds(message, st.sampled_from(TYPES), EVENT_ID, KEY, INTERACTION,
              st.sampled_from([0.5, 1, -1, 1e9]), st.sampled_from([None, 2, 0])),
    st.text(max_size=20),
    st.binary(max_size=8),
    JSON.map(json.dumps),
)


@pytest.fixture(scope="module")
def host():
    h = WorldHost(tiny_world_model(), max_sessions=4)
    yield h
    h.shutdown()


async def good_run(host: WorldHost, seed: int = 9) -> list[dict]:
    """A well-behaved session: 4 chunks, right held from the second; its chunks' metadata."""
    events = []
    got_chunk = asyncio.Event()

    async def emit(ev):
        events.append(ev)

    async def emit_chunk(meta, payload):
        events.append(meta)
        got_chunk.set()

    conn = Connection(WORLD_PROTOCOL, lambda peer: WorldHandlers(peer, host), emit, emit_chunk)
    await conn.handle(json.dumps({"type": "session.create", "seed": seed, "fps": 0, "num_frames": 8}))
    await got_chunk.wait()
    await conn.handle(json.dumps({"type": "key.down", "key": "right", "event_id": "r"}))
    while not any(e["type"] == "session.closed" for e in events):
        await asyncio.sleep(0.01)
    await conn.close()
    metas = [e for e in events if e["type"] == "video.chunk_metadata"]
    return metas


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(FRAME, max_size=25))
def test_noise_never_crashes_and_others_are_unaffected(host, frames):
    async def main():
        out = []

        async def emit(ev):
            out.append(ev)

        async def emit_chunk(meta, payload):
            out.append(meta)

        noisy = Connection(WORLD_PROTOCOL, lambda peer: WorldHandlers(peer, host), emit, emit_chunk)
        good = asyncio.create_task(good_run(host))
        for f in frames:
            n = len(out)
            await noisy.handle(f, binary=isinstance(f, bytes))
            answers = [e for e in out[n:] if e["type"] not in ("video.chunk_metadata", "session.behind")]
            assert answers, f"no answer to {f!r}"
            for e in answers:
                if e["type"] == "error":
                    assert e["code"] != "server_error", e
                    assert e["code"] and e["message"]
                    try:
                        sent = json.loads(f)
                    except (ValueError, TypeError):
                        continue
                    eid = sent.get("event_id") if isinstance(sent, dict) else None
                    if isinstance(eid, int | str) and not isinstance(eid, bool) and eid != "":
                        assert e["event_id"] == eid, (f, e)
        await noisy.close()
        return await good

    metas = asyncio.run(main())
    assert host.num_sessions == 0
    assert len(metas) == 4
    assert [h for m in metas for h in m["frame_sha256"]] == offline_hashes(host.model, 9, "", metas)
