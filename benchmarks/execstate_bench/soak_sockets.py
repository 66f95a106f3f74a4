"""The soak's WebSocket clients: one connection's life on each realtime surface.

- ``realtime`` (``/v1/realtime``): a session created, two steps, a checkpoint, a fork of it, a
  rollback, then closed; one in eight connections is dropped mid-step instead (its sessions are
  closed with the socket).
- ``agent`` (``/v1/realtime/agent``): an agent opened, a user turn, its response, closed.
- ``voice`` (``/v1/voice/realtime``): a voice agent with manual turns: half a second of
  synthesised speech (eSpeak NG, ``speech``), committed, answered (the agent's audio counted),
  closed.
- ``world`` (``/v1/realtime/video``): a world session of a few chunks with a held key, stopped.

The key goes in the ``Authorization`` header. An ``error`` event whose ``type`` is
``server_error`` (or a closed socket where an answer was due) is recorded as the surface's
outcome; the rest as ``ok``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from execstate_bench.soak_clients import Soak, ids

RECV_S = 60.0
MAX_FRAME = 16 << 20


class Closed(Exception):
    """The server closed the socket where an answer was due."""


def _ws_url(s: Soak, path: str) -> str:
    return s.url.replace("http://", "ws://", 1) + path


async def _until(ws: Any, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first JSON event ``done`` accepts (binary frames are skipped); an ``error`` event of type
    ``server_error`` is raised as a ``RuntimeError`` naming its code."""
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), RECV_S)
        except Exception as e:
            raise Closed(type(e).__name__) from None
        if isinstance(raw, bytes):
            continue
        event = json.loads(raw)
        err = event.get("error") if event.get("type") == "error" else None
        if isinstance(err, dict) and err.get("type") == "server_error":
            raise RuntimeError(err.get("code") or "server_error")
        if done(event):
            return event


async def _run(s: Soak, surface: str, path: str, rng: random.Random, body: Callable[[Any], Any]) -> None:
    t = time.monotonic()
    try:
        async with connect(_ws_url(s, path), additional_headers=s.auth(rng), max_size=MAX_FRAME,
                           open_timeout=30) as ws:
            outcome = await body(ws)
    except Closed:
        outcome = "closed"
    except RuntimeError as e:
        outcome = str(e)
    except OSError as e:  # refused before the upgrade (a 4xx), or the connection failed
        outcome = f"connect:{type(e).__name__}"
    except Exception as e:  # the upgrade answered with a status: websockets' InvalidStatus
        status = getattr(getattr(e, "response", None), "status_code", None)
        outcome = str(status) if status is not None else f"ws:{type(e).__name__}"
    s.record(surface, t, outcome)


def _type(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("type") in (name, "error")


async def realtime(s: Soak, rng: random.Random) -> None:
    async def body(ws: Any) -> str:
        await ws.send(json.dumps({"type": "session.create", "session": {"max_tokens": 6}}))
        if (await _until(ws, _type("session.created")))["type"] == "error":
            return "refused"
        await ws.send(json.dumps({"type": "response.create", "input": {"token_ids": ids(rng, 8)}}))
        if rng.random() < 0.125:
            await _until(ws, _type("response.created"))
            return "cut"  # dropped mid-step: the socket closes with the step in flight
        await _until(ws, _type("response.done"))
        await ws.send(json.dumps({"type": "session.checkpoint"}))
        cp = (await _until(ws, _type("session.checkpointed"))).get("checkpoint_id")
        await ws.send(json.dumps({"type": "response.create", "input": {"token_ids": ids(rng, 4)}}))
        await _until(ws, _type("response.done"))
        if cp is not None:
            await ws.send(json.dumps({"type": "session.fork", "checkpoint_id": cp}))
            await _until(ws, _type("session.forked"))
            await ws.send(json.dumps({"type": "session.rollback", "checkpoint_id": cp}))
            await _until(ws, _type("session.rolled_back"))
        await ws.send(json.dumps({"type": "session.close"}))
        await _until(ws, _type("session.closed"))
        return "ok"

    await _run(s, "realtime", "/v1/realtime", rng, body)


async def agent(s: Soak, rng: random.Random) -> None:
    async def body(ws: Any) -> str:
        await ws.send(json.dumps({"type": "session.create", "session": {"max_response_tokens": 8}}))
        if (await _until(ws, _type("session.created")))["type"] == "error":
            return "refused"
        await ws.send(json.dumps({"type": "input_text.append", "text": f"what is {rng.randrange(9)} plus 2"}))
        await _until(ws, _type("response.done"))
        await ws.send(json.dumps({"type": "session.close"}))
        await _until(ws, _type("session.closed"))
        return "ok"

    await _run(s, "agent", "/v1/realtime/agent", rng, body)


def speech(text: str = "what is two plus two") -> bytes:
    """Half a second or more of eSpeak NG speech, PCM16 at 24 kHz (the voice protocol's default)."""
    from execstate.voice.espeak import Espeak
    from execstate.voice.resample import resample
    from execstate_bench.voice_script import RATE, speak

    utt = speak(Espeak(), text)  # 16 kHz int16
    return resample(utt.samples, RATE, 24000).astype(np.int16).tobytes()


async def voice(s: Soak, rng: random.Random, audio: bytes) -> None:
    async def body(ws: Any) -> str:
        await _until(ws, _type("session.created"))
        await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
        await _until(ws, _type("session.updated"))
        for i in range(0, len(audio), 9600):  # 200 ms appends
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(audio[i:i + 9600]).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        await _until(ws, _type("response.done"))
        return "ok"

    await _run(s, "voice", "/v1/voice/realtime", rng, body)


async def world(s: Soak, rng: random.Random) -> None:
    async def body(ws: Any) -> str:
        await ws.send(json.dumps({"type": "session.create", "prompt": "a meadow maze", "seed": rng.randrange(99),
                                  "fps": 0, "format": "png", "num_frames": 12}))
        first = await _until(ws, lambda e: e.get("type") in ("video.start", "error"))
        if first["type"] == "error":
            return str(first.get("code") or "refused")
        await ws.send(json.dumps({"type": "key.down", "key": rng.choice(["up", "left", "right", "down"])}))
        await _until(ws, lambda e: e.get("type") in ("session.closed", "error"))
        return "ok"

    await _run(s, "world", "/v1/realtime/video", rng, body)
