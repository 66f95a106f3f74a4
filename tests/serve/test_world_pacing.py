"""Pacing of a world session: at a target fps chunks come no faster than real time (one chunk
ahead at most); a session slower than real time reports how far behind it is."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.asyncio.client import connect
from world_serve_helpers import WorldClient, tiny_world_model, world_server, ws_url

from execstate.serve.realtime.world.host import WorldHost


class SlowModel:
    """The tiny model, with every decode taking ``delay_s`` longer (a model slower than real time)."""

    def __init__(self, model, delay_s: float) -> None:
        self._model = model
        self.spec = model.spec
        self.delay_s = delay_s

    def decode(self, latents):
        time.sleep(self.delay_s)
        return self._model.decode(latents)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


def test_real_time_pacing(model):
    host = WorldHost(model)
    fps, n = 20.0, 8
    period = 2 / fps
    try:
        with world_server(host) as url:
            async def main():
                async with connect(ws_url(url)) as ws:
                    c = WorldClient(ws)
                    await c.ask({"type": "session.create", "fps": fps, "num_frames": 2 * n})
                    arrivals = []
                    while len(arrivals) < n:
                        await c.chunk()
                        arrivals.append(time.perf_counter())
                    done = await c.until("session.closed")
                    assert done["frames"] == 2 * n and done["stopped"] is False
                    return arrivals, c
            arrivals, c = asyncio.run(main())
    finally:
        host.shutdown()
    # chunk k is made no earlier than one chunk before its slot: k >= 1 at origin + (k - 1) * period
    assert arrivals[-1] - arrivals[0] >= (n - 2) * period * 0.95
    assert all(m["behind_ms"] is not None and m["behind_ms"] >= 0 for m, _ in c.chunks)


def test_behind_real_time_is_reported(model):
    host = WorldHost(SlowModel(model, 0.15))
    try:
        with world_server(host) as url:
            async def main():
                async with connect(ws_url(url)) as ws:
                    c = WorldClient(ws)
                    await c.ask({"type": "session.create", "fps": 100})  # 20 ms a chunk; a step takes > 150 ms
                    behind = await c.until("session.behind")
                    await c.ask({"type": "session.close"}, "session.closed")
                    return behind, c
            behind, c = asyncio.run(main())
    finally:
        host.shutdown()
    assert behind["behind_ms"] > 20 and behind["fps"] == 100
    metas = [m for m, _ in c.chunks]
    assert metas[-1]["behind_ms"] >= behind["behind_ms"] - 1e-6  # it only grows: never caught up
    assert behind["generation_chunk_index"] in [m["generation_chunk_index"] for m in metas]
