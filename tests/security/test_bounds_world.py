"""Finding 7: ``fps`` 5e-324 and ``num_frames`` 10**30 were accepted on the world socket
(a session paced one chunk per ~10**300 years, or asking for more frames than any server makes).
Now ``fps`` is 0 (as fast as possible) or in [1, 240], and ``num_frames`` in [1, the server's
``--world-max-frames``]: anything else is ``invalid_message`` and no session starts."""

from __future__ import annotations

import asyncio

from bounds_server import Raw, bounds_served, connect_raw, error_code  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

BAD_FPS = st.one_of(st.sampled_from([5e-324, 1e-300, 0.5, 0.999, 240.0001, 1e300, -1.0]),
                    st.floats(min_value=1e-300, max_value=0.999), st.floats(min_value=240.001, max_value=1e308))


def _start(served, fields: dict) -> dict:
    async def run() -> dict:
        async with connect_raw(served, "world") as ws:
            c = Raw(ws)
            event = await c.ask({"type": "session.create", "event_id": "s", **fields})
            if event["type"] == "video.start":
                await c.ask({"type": "session.close", "event_id": "x"}, "session.closed")
            return event

    return asyncio.run(run())


def test_hostile_fps_and_num_frames_are_refused(bounds_served):  # noqa: F811
    for fields in ({"fps": 5e-324}, {"fps": 0.5}, {"fps": 241}, {"fps": 0, "num_frames": 10**30},
                   {"fps": 0, "num_frames": bounds_served.world.max_frames + 1}, {"fps": 0, "num_frames": 0}):
        event = _start(bounds_served, fields)
        assert error_code(event) == "invalid_message" and event["event_id"] == "s", (fields, event)
    assert bounds_served.world.num_sessions == 0
    for fields in ({"fps": 0, "num_frames": 1}, {"fps": 1, "num_frames": 1}, {"fps": 240, "num_frames": 1},
                   {"fps": 0, "num_frames": bounds_served.world.max_frames}):
        assert _start(bounds_served, fields)["type"] == "video.start", fields


@settings(max_examples=25, deadline=None)
@given(BAD_FPS)
def test_no_fps_between_0_and_1_or_above_240(bounds_served, fps):  # noqa: F811
    event = _start(bounds_served, {"fps": fps, "num_frames": 1})
    assert error_code(event) == "invalid_message" and "fps" in event["message"], (fps, event)
