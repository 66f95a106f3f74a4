"""``execstate bench world --parts serve``: world sessions over the socket, as a browser runs them.

For each count of concurrent sessions (``sessions``, e.g. 1 and 4), a world-only app on a real
uvicorn in this process (the server's configuration: torch ``threads`` per step, ``step_workers``
steps at once) and that many WebSocket clients at once. Each client starts a session at ``fps``
(0: as fast as possible), holds a random key that changes every 2 to 6 chunks and, in a world with a
camera, turns it with a velocity now and then (as the page sends the mouse), for ``seconds``.
Per session: the first chunk after ``session.create`` (the rendered scene) and the first generated
chunk, in ms; frames per second delivered after the first chunk; the steps' p50 and p99 (from the
chunks' timings); how far behind real time it fell (``behind_ms``, at a target fps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from execstate.model.world.interface import WorldModel
from execstate.session.world.offline import known_scene
from execstate_bench.redis_server import free_port


@contextlib.contextmanager
def _served(host: Any) -> Iterator[str]:  # noqa: ANN401 - a WorldHost
    import uvicorn

    from execstate.serve.realtime.world.app import build_world_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_world_app(host), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the world server did not start")
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}/v1/realtime/video"
    finally:
        server.should_exit = True
        thread.join(15)


async def _client(url: str, spec: Any, fps: float, seconds: float, seed: int) -> dict[str, Any]:  # noqa: ANN401
    from websockets.asyncio.client import connect

    rng = random.Random(seed)
    keys = list(spec.keys[1:])
    out: dict[str, Any] = {"step_ms": [], "behind_ms": []}
    async with connect(url, max_size=None) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "session.create", "seed": known_scene(spec, seed), "fps": fps,
                                  "prompt": "a maze", "model": spec.model_id}))
        chunks, frames, change, t_first = 0, 0, 2, None
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "error":
                raise RuntimeError(f"the bench session failed: {ev}")
            if ev["type"] != "video.chunk_metadata":
                continue
            await ws.recv()  # the chunk's frames
            now = time.perf_counter()
            chunks += 1
            if chunks == 1:
                out["first_chunk_ms"], t_first = (now - t0) * 1000, now
            else:
                frames += ev["num_frames"]
                out["step_ms"].append(ev["timings"]["step_ms"])
                if ev.get("behind_ms") is not None:
                    out["behind_ms"].append(ev["behind_ms"])
            if chunks == 2:
                out["first_generated_chunk_ms"] = (now - t0) * 1000
            if t_first is not None and now - t_first >= seconds:
                break
            if chunks == change:
                change += rng.randint(2, 6)
                await ws.send(json.dumps({"type": "key.down", "key": rng.choice(keys)}))
                if spec.camera is not None and rng.random() < 0.5:
                    v = rng.uniform(-4, 4) * 2 * np.pi / 256
                    await ws.send(json.dumps({"type": "session.interaction", "interaction": {"event": {
                        "multi_modal_data": {"camera": {"mode": "velocity", "data": {"yaw": v}}}}}}))
        out["frames_per_s"] = frames / (time.perf_counter() - t_first)
        await ws.send(json.dumps({"type": "session.close"}))
        with contextlib.suppress(Exception):
            while json.loads(await ws.recv()).get("type") != "session.closed":
                pass
    return out


def bench_serve(model: WorldModel, sessions: tuple[int, ...] = (1, 4), fps: tuple[float, ...] = (0.0, 16.0),
                seconds: float = 20.0, step_workers: int | None = None) -> dict[str, Any]:
    """Module docstring; ``step_workers`` default: as many as sessions, at most the CPUs."""
    from execstate.serve.realtime.world.host import WorldHost

    runs = []
    for n in sessions:
        workers = step_workers or max(1, min(n, os.cpu_count() or 1))
        for rate in fps:
            host = WorldHost(model, model_name=model.spec.model_id, max_sessions=n, step_workers=workers,
                             session_memory_bytes=64 << 20)
            try:
                with _served(host) as url:
                    async def run(url: str = url, rate: float = rate, n: int = n) -> list[dict[str, Any]]:
                        return list(await asyncio.gather(*(_client(url, model.spec, rate, seconds, 100 + i)
                                                           for i in range(n))))

                    load_before = os.getloadavg()[0]
                    res = asyncio.run(run())
            finally:
                host.shutdown()
            steps = [x for r in res for x in r["step_ms"]]
            behind = [x for r in res for x in r["behind_ms"]]
            runs.append({
                "sessions": n, "fps_target": rate, "step_workers": workers, "seconds": seconds,
                "frames_per_s_each": [round(r["frames_per_s"], 1) for r in res],
                "first_chunk_ms": [round(r["first_chunk_ms"], 1) for r in res],
                "first_generated_chunk_ms": [round(r["first_generated_chunk_ms"], 1) for r in res],
                "step_ms_p50": round(float(np.percentile(steps, 50)), 1),
                "step_ms_p99": round(float(np.percentile(steps, 99)), 1),
                "behind_ms_max": round(max(behind), 1) if behind else None,
                "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)})
    return {"runs": runs}
