"""AsyncWorld: several sessions at once equal their offline runs bit for bit; an event submitted
while its session computes a chunk is accepted at once and starts at the next boundary."""

from __future__ import annotations

import asyncio
import threading

import pytest
from world_helpers import run, start_frames, tiny_world_model

from execstate.session.runtime.events import SessionEventError
from execstate.session.world.async_world import AsyncWorld
from execstate.session.world.offline import World

KEYS = ["up", "left", "none", "right", "down", "down"]


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


def _plan(i: int) -> list[list[tuple[str, dict]]]:
    return [[("action", {"key": KEYS[(i + j) % len(KEYS)]})] for j in range(6)]


def test_four_sessions_at_once_equal_offline(model) -> None:
    offline = World(model=model)
    want = []
    for i in range(4):
        s = offline.open_session(prompt="a night maze", seed=i, start_frames=start_frames(seed=i))
        want.append(run(s, _plan(i)))
    offline.close()

    world = World(model=model, max_sessions=4)
    aw = AsyncWorld(world, step_workers=2)

    async def one(i: int) -> list[str]:
        info = await aw.open(prompt="a night maze", seed=i, start_frames=start_frames(seed=i))
        out = []
        for j, events in enumerate(_plan(i)):
            for kind, data in events:
                await aw.submit_event(info.session_id, j, kind, data)
            out.append((await aw.step(info.session_id)).frames_sha256)
        return out

    async def main() -> list[list[str]]:
        got = await asyncio.gather(*(one(i) for i in range(4)))
        with pytest.raises(SessionEventError) as e:
            await aw.open()
        assert e.value.code == "capacity"
        world.sessions.check_integrity()
        await aw.shutdown()
        return list(got)

    assert asyncio.run(main()) == want
    world.sessions.check_integrity()
    assert world.sessions.store.pool.num_used == 0


def test_event_during_a_step_starts_at_the_next_boundary(model) -> None:
    world = World(model=model)
    aw = AsyncWorld(world)
    computing, release = threading.Event(), threading.Event()
    orig = model.decode

    def slow_decode(latents):
        computing.set()
        assert release.wait(30)
        return orig(latents)

    async def main() -> None:
        info = await aw.open(seed=0, start_frames=start_frames())
        sid = info.session_id
        model.decode = slow_decode
        try:
            task = asyncio.create_task(aw.step(sid))
            assert await asyncio.to_thread(computing.wait, 30)
            assert (await aw.info(sid)).stepping
            ack = await aw.submit_event(sid, 0, "key", {"key": "left", "down": True})  # not blocked by the step
            assert ack.status == "accepted" and not task.done()
            with pytest.raises(SessionEventError) as e:
                await aw.step(sid)
            assert e.value.code == "busy"
            release.set()
            r1 = await task
        finally:
            del model.decode
        assert r1.events == {"started": [], "active": [], "completed": []} and r1.keys == ("none", "none")
        r2 = await aw.step(sid)
        assert r2.events["started"] == [0] and r2.keys == ("left", "left")
        assert (sid, 0) in aw.received_at
        cp = await aw.checkpoint(sid)
        fork = await aw.fork(sid, cp)
        assert fork.step_index == 2 and fork.held_key == "left"
        await aw.rollback(sid, cp)
        await aw.release_checkpoint(sid, cp)
        with pytest.raises(SessionEventError) as e:
            await aw.rollback(sid, 3)
        assert e.value.code == "invalid"
        assert len(await aw.list()) == 2
        await aw.shutdown()

    asyncio.run(main())
    world.sessions.check_integrity()
    assert world.sessions.store.pool.num_used == 0
