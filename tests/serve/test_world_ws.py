"""The world WebSocket against a real uvicorn with a tiny random world model: frames over the
socket equal the offline driver's bit for bit (sha256 of each frame), for one session and for
four at once; capacity and memory refusals; disconnect releases; pause; checkpoint/rollback."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from world_serve_helpers import WorldClient, offline_hashes, tiny_world_model, world_server, ws_url

from execstate.serve.realtime.world.encode import decode_chunk, frame_sha256
from execstate.serve.realtime.world.host import WorldHost


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


@pytest.fixture(scope="module")
def served(model):
    host = WorldHost(model, max_sessions=4)
    with world_server(host) as url:
        yield host, url
    host.shutdown()


async def drive(url: str, seed: int, prompt: str, n_chunks: int, fmt: str = "png") -> WorldClient:
    """A session that presses right, changes the prompt, releases; ``n_chunks`` chunks."""
    async with connect(ws_url(url)) as ws:
        c = WorldClient(ws)
        start = await c.ask({"type": "session.create", "prompt": prompt, "seed": seed, "fps": 0, "format": fmt,
                             "event_id": "s"})
        assert start["type"] == "video.start", start
        await c.chunk()
        assert (await c.ask({"type": "key.down", "key": "right", "event_id": "r"}))["event_id"] == "r"
        await c.chunk()
        await c.chunk()
        q = await c.ask({"type": "session.interaction", "interaction": {
            "event_id": "p", "event": {"prompt": "a lava maze"}}})
        assert q["type"] == "session.interaction.queued" and q["event_id"] == "p", q
        await c.ask({"type": "key.up", "key": "right", "event_id": "u"})
        while len(c.chunks) < n_chunks or not any("u" in m["completed_event_ids"] for m, _ in c.chunks):
            await c.chunk()  # fps 0: chunks stream back to back; the events apply when they arrive
        done = await c.ask({"type": "session.close", "event_id": "x"}, "session.closed")
        assert done["stopped"] is True and done["event_id"] == "x"
        return c


def check_against_offline(model, c: WorldClient, seed: int, prompt: str, fmt: str = "png") -> None:
    metas = [m for m, _ in c.chunks]
    assert [m["generation_chunk_index"] for m in metas] == list(range(len(metas)))
    assert [m["transport_chunk_index"] for m in metas] == list(range(len(metas)))
    got = [h for m in metas for h in m["frame_sha256"]]
    assert got == offline_hashes(model, seed, prompt, metas)
    shape = model.spec.frame_shape
    decoded = [frame_sha256(fr) for m, p in c.chunks for fr in decode_chunk(p, m["frame_byte_lengths"], fmt, shape)]
    assert decoded == got  # the bytes sent are the frames hashed
    # the events took effect: right was held in some chunks, the prompt changed once, then released
    keys = [m["keys"][0] for m in metas]
    assert "right" in keys and keys[0] == "none"
    started = [e for m in metas for e in m["started_event_ids"]]
    completed = [e for m in metas for e in m["completed_event_ids"]]
    assert started == ["r", "p", "u"] and sorted(completed) == ["p", "r", "u"]  # an up is an event too
    assert sum(m["prompt"] is not None for m in metas) == 1
    assert metas[-1]["prompt_version"] == 1


def test_ws_equals_offline(model, served):
    host, url = served
    c = asyncio.run(drive(url, seed=5, prompt="a snow maze", n_chunks=8))
    check_against_offline(model, c, 5, "a snow maze")
    first = c.chunks[0][0]
    assert first["timings"]["since_start_ms"] > 0 and first["behind_ms"] is None  # fps 0: no real-time clock
    assert host.num_sessions == 0


def test_rgb_format_equals_offline(model, served):
    _, url = served
    c = asyncio.run(drive(url, seed=2, prompt="", n_chunks=6, fmt="rgb"))
    check_against_offline(model, c, 2, "", fmt="rgb")
    assert all(m["byte_length"] == 2 * 48 * 48 * 3 for m, _ in c.chunks)


def test_four_sessions_at_once_are_isolated(model, served):
    host, url = served
    seeds = [11, 12, 13, 14]

    async def main():
        return await asyncio.gather(*(drive(url, s, f"a {t} maze", 7) for s, t in zip(
            seeds, ("meadow", "desert", "night", "ocean"), strict=True)))

    clients = asyncio.run(main())
    for s, t, c in zip(seeds, ("meadow", "desert", "night", "ocean"), clients, strict=True):
        check_against_offline(model, c, s, f"a {t} maze")
    assert host.num_sessions == 0


def test_capacity_refusal_and_disconnect_release(model, served):
    host, url = served

    async def main():
        conns = [await connect(ws_url(url)) for _ in range(5)]
        clients = [WorldClient(ws) for ws in conns]
        for i, c in enumerate(clients[:4]):
            ev = await c.ask({"type": "session.create", "seed": i, "fps": 1})
            assert ev["type"] == "video.start", ev
        assert host.num_sessions == 4
        refused = await clients[4].ask({"type": "session.create", "event_id": 7, "fps": 1})
        assert refused["type"] == "error" and refused["code"] == "capacity" and refused["event_id"] == 7
        assert "--world-max-sessions" in refused["message"]
        await conns[0].close()  # a disconnect releases its session: the refused client gets in
        for _ in range(200):
            if host.num_sessions == 3:
                break
            await asyncio.sleep(0.05)
        assert host.num_sessions == 3
        ok = await clients[4].ask({"type": "session.create", "fps": 1})
        assert ok["type"] == "video.start"
        for ws in conns[1:]:
            await ws.close()
        for _ in range(200):
            if host.num_sessions == 0:
                break
            await asyncio.sleep(0.05)
        assert host.num_sessions == 0

    asyncio.run(main())


def test_memory_budget_refusal(model):
    spec = model.spec
    block = spec.kv.bytes_per_chunk() // 2  # the runtime's blocks: one frame's tokens, 2 a chunk
    least = (spec.sink_chunks + spec.max_window_chunks + 1) * 2
    with pytest.raises(ValueError, match="needs at least"):
        WorldHost(model, session_memory_bytes=(least - 1) * block)
    host = WorldHost(model, session_memory_bytes=least * block)  # the window, nothing for checkpoints
    try:
        with world_server(host) as url:
            async def main():
                async with connect(ws_url(url)) as ws:
                    c = WorldClient(ws)
                    ev = await c.ask({"type": "session.create", "fps": 0, "num_frames": 12})
                    assert ev["type"] == "video.start" and ev["config"]["memory_bytes"] == least * block
                    while (ev := await c.recv())["type"] != "session.paused":  # a checkpoint after each chunk
                        if ev["type"] == "video.chunk_metadata":
                            await c.send({"type": "session.checkpoint", "event_id": f"cp{len(c.chunks)}"})
                    assert ev["reason"] == "budget"  # the next step would exceed the budget: refused, paused
                    await c.ask({"type": "session.ping"}, "session.pong")  # every checkpoint answered
                    refused = [e for e in c.events if e["type"] == "error"]
                    assert [e["code"] for e in refused] == ["budget"] and "budget" in refused[0]["message"]
                    cps = [e["checkpoint_id"] for e in c.events if e["type"] == "session.checkpointed"]
                    assert cps
                    for cp in cps:
                        assert (await c.ask({"type": "checkpoint.release", "checkpoint_id": cp}))["type"] == \
                            "checkpoint.released"
                    assert (await c.ask({"type": "session.unpause"}))["type"] == "session.unpaused"
                    done = await c.until("session.closed")
                    return done
            done = asyncio.run(main())
            assert done["stopped"] is False and done["frames"] == 12  # it went on once the pins were released
    finally:
        host.shutdown()


async def after_resume(c: WorldClient, step_index: int, n: int = 3) -> list[dict]:
    """Resume, then the ``n`` chunks that follow ``step_index``: from ``c.chunks``, starting at the
    chunk numbered ``step_index + 1`` (a chunk may arrive before the resume's acknowledgement, and
    ``ask`` reads it on the way; a chunk of the abandoned branch, in flight at the pause before a
    rollback, may arrive after the mark)."""
    mark = len(c.chunks)
    await c.ask({"type": "session.unpause"})
    while True:
        metas = [m for m, _ in c.chunks[mark:]]
        starts = [i for i, m in enumerate(metas) if m["generation_chunk_index"] == step_index + 1]
        if starts and len(metas) - starts[0] >= n:
            return metas[starts[0] : starts[0] + n]
        await c.chunk()


def test_pause_checkpoint_rollback_reproduces(model, served):
    _, url = served

    async def main():
        async with connect(ws_url(url)) as ws:
            c = WorldClient(ws)
            await c.ask({"type": "session.create", "seed": 4, "fps": 0})
            await c.chunk()
            assert (await c.ask({"type": "session.pause", "event_id": 1}))["type"] == "session.paused"
            n = len(c.chunks)
            await asyncio.sleep(0.3)
            while True:  # at most the step in progress arrives after the pause
                try:
                    await c.recv(timeout=0.3)
                except TimeoutError:
                    break
            assert len(c.chunks) <= n + 1
            again = await c.ask({"type": "session.pause", "event_id": 2})
            assert again["code"] == "already_paused" and again["event_id"] == 2
            cp = await c.ask({"type": "session.checkpoint", "event_id": 3})
            assert cp["type"] == "session.checkpointed", cp
            await c.ask({"type": "key.down", "key": "up"})
            first = await after_resume(c, cp["step_index"])
            await c.ask({"type": "session.pause"})
            rb = await c.ask({"type": "session.rollback", "checkpoint_id": cp["checkpoint_id"], "event_id": 4})
            assert rb["type"] == "session.rolled_back" and rb["step_index"] == cp["step_index"]
            bad = await c.ask({"type": "session.rollback", "checkpoint_id": "nope", "event_id": 5})
            assert bad["code"] == "not_found" and bad["event_id"] == 5  # the runtime's code
            # the rollback restored the events too (the key.down came after the checkpoint): send it again
            again = await c.ask({"type": "key.down", "key": "up", "event_id": "up-again"})
            assert again["type"] == "session.interaction.queued", again
            second = await after_resume(c, cp["step_index"])
            # the same events at the same boundaries, the same RNG state: the same frames, bit for bit
            assert [m["keys"] for m in second] == [m["keys"] for m in first]
            assert [m["frame_sha256"] for m in second] == [m["frame_sha256"] for m in first]
            assert [m["generation_chunk_index"] for m in second] == [m["generation_chunk_index"] for m in first]
            await c.ask({"type": "session.close"}, "session.closed")

    asyncio.run(main())


def test_vllm_omni_shaped_client(served):
    """vLLM-Omni's session.create fields (checked against the model), its interaction shape, and the
    refusals of what this model does not do, each naming the problem."""
    _, url = served

    async def main():
        async with connect(ws_url(url)) as ws:
            c = WorldClient(ws)
            for bad, code, word in [
                ({"width": 64}, "invalid_message", "width"),
                ({"model": "other"}, "model_not_found", "other"),
                ({"extra_params": {"x": 1}}, "invalid_message", "extra_params"),
                ({"format": "m4s"}, "invalid_message", "format"),
                ({"num_inference_steps": 50}, "invalid_message", "num_inference_steps"),
                ({"guidance_scale": 5.0}, "invalid_message", "guidance"),
            ]:
                ev = await c.ask({"type": "session.create", "event_id": "bad", **bad})
                assert (ev["type"], ev["code"], ev["event_id"]) == ("error", code, "bad") and word in ev["message"], ev
            start = await c.ask({"type": "session.create", "model": "world", "prompt": "a desert maze", "width": 48,
                                 "height": 48, "fps": 0, "num_frames": 6, "num_inference_steps": 2,
                                 "guidance_scale": 1.0, "seed": 42, "extra_params": {}, "format": "png"})
            assert start["type"] == "video.start" and start["config"]["seed"] == 42
            cam = await c.ask({"type": "session.interaction", "interaction": {"event_id": "c", "event": {
                "multi_modal_data": {"camera": {"schema": "camera.v1", "mode": "target", "data": {}}}}}})
            assert (cam["code"], cam["event_id"]) == ("unsupported_interaction_schema", "c"), cam
            tr = await c.ask({"type": "session.interaction", "interaction": {
                "event_id": "t", "event": {"prompt": "a snow maze"}, "transition_chunks": 2}})
            assert (tr["code"], tr["event_id"]) == ("unsupported_transition", "t"), tr
            done = await c.until("session.closed")
            assert (done["chunks"], done["frames"], done["stopped"]) == (3, 6, False)
            metas = [m for m, _ in c.chunks]
            assert all(m["kind"] == "media" and m["num_frames"] == 2 for m in metas)
            assert [m["transport_chunk_index"] for m in metas] == [0, 1, 2]

    asyncio.run(main())


def test_socket_limits(served):
    """Over the real socket: an oversized text frame and a binary frame get errors naming the
    problem, and the connection goes on."""
    _, url = served

    async def main():
        async with connect(ws_url(url)) as ws:
            c = WorldClient(ws)
            big = await c.ask("x" * (70 << 10))
            assert big["code"] == "message_too_large" and "65536" in big["message"]
            await ws.send(b"\x00\x01")
            binary = await c.recv()
            assert binary["code"] == "invalid_message" and "binary" in binary["message"]
            assert (await c.ask({"type": "session.ping", "event_id": 3}))["type"] == "session.pong"

    asyncio.run(main())
