"""Two worlds on one socket endpoint (the grid world and the first-person maze), and the maze's camera
over the protocol in vLLM-Omni's interaction shape: a target pose or a velocity, a received_at mapped
to a frame, applied at the next chunk boundary, acknowledged with the chunk that applies it, the held
key and the camera composed; frames over the socket equal the offline session's bit for bit."""

from __future__ import annotations

import asyncio
import math

import pytest
from websockets.asyncio.client import connect
from world_serve_helpers import WorldClient, tiny_world_model, world_server, ws_url

from execstate.model.world.maze.model import MazeWorldModel
from execstate.model.world.maze.pose import DTHETA, TURN_RATE
from execstate.serve.realtime.world.camera_schema import yaw_pitch
from execstate.serve.realtime.world.encode import frame_sha256
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.hosts import WorldHosts
from execstate.session.world.offline import World
from tests.model.world.maze.maze_helpers import random_maze_net


@pytest.fixture(scope="module")
def maze_model() -> MazeWorldModel:
    return MazeWorldModel(random_maze_net(), "tiny-maze-random")


@pytest.fixture(scope="module")
def served(maze_model):
    hosts = WorldHosts([WorldHost(tiny_world_model(), model_name="world", max_sessions=2),
                        WorldHost(maze_model, model_name="maze", max_sessions=2)])
    with world_server(hosts) as url:
        yield hosts, url
    hosts.shutdown()


def _quat_yaw(yaw: float) -> list[float]:
    return [0.0, math.sin(yaw / 2), 0.0, math.cos(yaw / 2)]


def test_quaternions_map_to_yaw_and_pitch() -> None:
    assert yaw_pitch(_quat_yaw(0.3)) == pytest.approx((0.3, 0.0))
    down = [math.sin(0.2 / 2), 0.0, 0.0, math.cos(0.2 / 2)]  # Unity: +X rotation tilts the view down
    assert yaw_pitch(down) == pytest.approx((0.0, -0.2))


async def _maze_session(url: str) -> WorldClient:
    async with connect(ws_url(url)) as ws:
        c = WorldClient(ws)
        start = await c.ask({"type": "session.create", "model": "maze", "prompt": "an ice maze", "seed": 3,
                             "fps": 0, "event_id": "s"})
        assert start["type"] == "video.start", start
        cfg = start["config"]
        assert cfg["world"] == "maze" and cfg["worlds"] == ["world", "maze"] and cfg["width"] == 64
        assert cfg["camera"]["modes"] == ["target", "velocity"] and "turn_left" in cfg["camera"]["turn_keys"]
        first, _ = await c.chunk()
        assert first["camera"] == [{"yaw": 0.0, "pitch": 0.0}] * 2
        q = await c.ask({"type": "session.interaction", "interaction": {
            "event_id": "v", "event": {"multi_modal_data": {"camera": {
                "schema": "camera.v1", "mode": "velocity", "data": {"rotation": _quat_yaw(3 * DTHETA)}}}}}})
        assert q["type"] == "session.interaction.queued" and q["at_frame"] == 0 and q["received_at"] > 0
        await c.ask({"type": "key.down", "key": "turn_left", "event_id": "k"})
        while not any("k" in m["started_event_ids"] for m, _ in c.chunks):
            await c.chunk()
        q = await c.ask({"type": "session.interaction", "interaction": {
            "event_id": "t", "transition_chunks": 2, "event": {"multi_modal_data": {
                "camera": {"mode": "target", "data": {"yaw": 1.0, "pitch": 0.1}},
                "action": {"schema": "keys.v1", "mode": "velocity", "data": {"keys": []}}}}}})
        assert q["event_id"] == "t"
        while not any("t" in m["completed_event_ids"] for m, _ in c.chunks):
            await c.chunk()
        await c.ask({"type": "session.close", "event_id": "x"}, "session.closed")
        return c


def test_a_maze_session_is_steered_by_the_camera_and_equals_offline(served, maze_model) -> None:
    hosts, url = served
    c = asyncio.run(_maze_session(url))
    metas = [m for m, _ in c.chunks]
    by_event = {e: i for i, m in enumerate(metas) for e in m["started_event_ids"]}
    v, k, t = by_event["v"], by_event["k"], by_event["t"]
    assert 1 <= v <= k < t
    yaws = [f["yaw"] for m in metas for f in m["camera"]]
    if v < k:  # the velocity alone: 3 columns a frame
        assert yaws[2 * v + 1] - yaws[2 * v] == pytest.approx(3 * DTHETA, abs=1e-6)
    # the velocity and the held turn key compose: 3 - 4 columns a frame
    assert yaws[2 * k + 1] - yaws[2 * k] == pytest.approx(3 * DTHETA - TURN_RATE, abs=1e-6)
    assert "v" in metas[t]["completed_event_ids"]  # the target replaced the velocity
    done = next(i for i, m in enumerate(metas) if "t" in m["completed_event_ids"])
    assert done == t + 1 and metas[done]["camera"][-1] == pytest.approx({"yaw": 1.0, "pitch": 0.1})
    assert all(m["keys"] == ["none", "none"] for m in metas[t:])  # the key was released with the target
    # the offline session, fed the same events at the same boundaries, gives the same frames
    world = World(maze_model, max_sessions=1)
    try:
        s = world.open_session(prompt="an ice maze", seed=3, scene_seed=3)
        hashes = list(metas[0]["frame_sha256"])
        for i, m in enumerate(metas[1:], start=1):
            if i == v:
                s.submit_event(s.next_event_id(), "camera", {"mode": "velocity", "yaw": 3 * DTHETA, "pitch": 0.0})
            if i == k:
                s.submit_event(s.next_event_id(), "key", {"key": "turn_left", "down": True})
            if i == t:
                s.submit_event(s.next_event_id(), "composite", {"events": [
                    {"kind": "key", "data": {"key": "turn_left", "down": False}},
                    {"kind": "camera", "data": {"mode": "target", "yaw": 1.0, "pitch": 0.1,
                                                "transition_chunks": 2}}]})
            r = s.step()
            assert [p[0] for p in r.camera] == pytest.approx([f["yaw"] for f in m["camera"]], abs=1e-6)
            hashes += [frame_sha256(fr) for fr in r.frames]
        assert hashes == [h for m in metas for h in m["frame_sha256"]]
    finally:
        world.close()
    assert hosts.num_sessions == 0


def test_the_grid_world_is_the_default_and_has_no_camera(served) -> None:
    _, url = served

    async def go() -> None:
        async with connect(ws_url(url)) as ws:
            c = WorldClient(ws)
            start = await c.ask({"type": "session.create", "fps": 0, "num_frames": 4, "event_id": 1})
            assert start["config"]["world"] == "grid" and "camera" not in start["config"]
            err = await c.ask({"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {
                "camera": {"mode": "velocity", "data": {"yaw": 0.1}}}}}, "event_id": "c"})
            assert err["type"] == "error" and err["code"] == "unsupported_interaction_schema"
            await c.until("session.closed")
            bad = await c.ask({"type": "session.create", "model": "doom", "event_id": 2})
            assert bad["code"] == "model_not_found" and "maze" in bad["message"]

    asyncio.run(go())


@pytest.mark.parametrize(("camera", "tc", "code"), [
    ({"mode": "target", "data": {"translation": [0, 0, 1]}}, None, "unsupported_interaction_schema"),
    ({"schema": "camera.v2", "data": {"yaw": 1.0}}, None, "unsupported_interaction_schema"),
    ({"mode": "velocity", "data": {"yaw": 0.1}}, 2, "unsupported_transition"),
    ({"mode": "target", "data": {"rotation": [0, 0, 0, 0]}}, None, "invalid_message"),
    ({"mode": "target", "data": {"yaw": 1.0, "rotation": [0, 0, 0, 1]}}, None, "invalid_message"),
    ({"mode": "spin", "data": {"yaw": 1.0}}, None, "invalid_message"),
    ({"mode": "velocity", "data": {"yaw": 3.0}}, None, "invalid")])
def test_bad_camera_interactions_are_refused(served, camera, tc, code) -> None:
    _, url = served

    async def go() -> dict:
        async with connect(ws_url(url)) as ws:
            c = WorldClient(ws)
            await c.ask({"type": "session.create", "model": "maze", "fps": 1, "event_id": "s"})
            it = {"event": {"multi_modal_data": {"camera": camera}}}
            if tc is not None:
                it["transition_chunks"] = tc
            err = await c.ask({"type": "session.interaction", "interaction": it, "event_id": "c"})
            await c.ask({"type": "session.close"}, "session.closed")
            return err

    err = asyncio.run(go())
    assert err["type"] == "error" and err["code"] == code, err
