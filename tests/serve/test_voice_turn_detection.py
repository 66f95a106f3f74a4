"""``/v1/voice/realtime``'s model and turn detection settings with the official ``openai`` SDK:
a model other than the served one is refused with a clear ``model_not_found`` (on connect, and in
``session.model``); ``semantic_vad`` with each ``eagerness`` round-trips and sets the end score
threshold and the silences; bad values are refused naming the field. Then a spoken question
under ``semantic_vad``: the turn ends, its words were prefilled while spoken."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from serve_helpers import MODEL_NAME
from voice_serve_helpers import speech, stream_audio, voice_app, voice_server

from execstate.serve.realtime.voice.convert import EAGERNESS

openai = pytest.importorskip("openai")


def client(url: str):
    return openai.AsyncOpenAI(api_key="none", base_url=url + "/v1",
                              websocket_base_url=url.replace("http", "ws") + "/v1/voice")


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_another_model_is_refused_with_the_served_name(served):
    async def main():
        with voice_server(served) as url:
            async with client(url).realtime.connect(model="gpt-realtime") as conn:
                first = await conn.recv()
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                created = await conn.recv()
                await conn.session.update(session={"model": "gpt-realtime"})
                refused = await conn.recv()
                await conn.session.update(session={"model": MODEL_NAME})
                ok = await conn.recv()
        return first, created, refused, ok

    first, created, refused, ok = run(main())
    assert first.type == "error" and first.error.code == "model_not_found"
    assert "'gpt-realtime'" in first.error.message and repr(MODEL_NAME) in first.error.message
    assert created.type == "session.created" and created.session.model == MODEL_NAME
    assert refused.type == "error" and refused.error.code == "model_not_found"
    assert ok.type == "session.updated"


def test_semantic_vad_eagerness_round_trips_and_bad_values_are_refused(served):
    async def main():
        out = {}
        with voice_server(served) as url:
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                await conn.recv()
                for eager in ("low", "medium", "high", "auto"):
                    await conn.session.update(session={"audio": {"input": {"turn_detection": {
                        "type": "semantic_vad", "eagerness": eager}}}})
                    out[eager] = (await conn.recv()).session.audio.input.turn_detection
                bad = []
                for td in ({"type": "semantic_vad", "eagerness": "eager"},
                           {"type": "semantic_vad", "end_of_turn_threshold": 1.5},
                           {"type": "server_vad", "eagerness": "high"},
                           {"type": "semantic_vad", "silence_duration_ms": 0}):
                    await conn.session.update(session={"audio": {"input": {"turn_detection": td}}})
                    bad.append(await conn.recv())
                await conn.session.update(session={"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
                back = (await conn.recv()).session.audio.input.turn_detection
        return out, bad, back

    out, bad, back = run(main())
    for eager, td in out.items():
        thr, short, long = EAGERNESS[eager]
        extra = td.model_extra or {}
        assert td.type == "semantic_vad" and td.silence_duration_ms == short
        assert extra["end_of_turn_threshold"] == thr and extra["end_of_turn_silence_ms"] == long
    assert [b.type for b in bad] == ["error"] * 4
    assert [b.error.code for b in bad] == ["invalid"] * 4
    assert "eagerness" in bad[0].error.message and "end_of_turn_threshold" in bad[1].error.message
    assert back.type == "server_vad" and "end_of_turn_threshold" not in (back.model_extra or {})


def test_a_spoken_turn_under_semantic_vad_is_prefilled_and_answered(served):
    async def main():
        with voice_app(served) as (url, app):
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                await conn.recv()
                await conn.session.update(session={"audio": {"input": {"turn_detection": {
                    "type": "semantic_vad", "eagerness": "high"}}}})
                await conn.recv()

                async def send(b):
                    await conn.input_audio_buffer.append(audio=b)

                audio = np.concatenate([np.zeros(4800, np.int16), speech("what is the code of zebra"),
                                        np.zeros(24000 * 3, np.int16)])
                sender = asyncio.create_task(stream_audio(send, audio))
                events = []
                while True:
                    e = await asyncio.wait_for(conn.recv(), 30)
                    events.append(e)
                    if e.type == "response.created":
                        break
                sender.cancel()
                va = next(iter(app.state.voice.agents.values()))
                return events, va.agent.prefill.stats

    events, stats = run(main())
    done = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert done.transcript == "what is the code of zebra"
    assert stats.speculations >= 1 and stats.computed > 0
