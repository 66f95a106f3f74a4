"""The OpenAI Realtime audio protocol (``/v1/voice/realtime``) with the official ``openai`` SDK's
realtime client: a synthesised spoken question in, audio and transcripts out; a barge-in; a cancel;
a truncate; bounded and refused input. The front is the tiny random model (its words are noise;
the delegation, the template answer and the audio path are real)."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from serve_helpers import MODEL_NAME
from voice_serve_helpers import speech, stream_audio, voice_server

from execstate.agent.config import AgentConfig

openai = pytest.importorskip("openai")

VAD = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 200, "prefix_padding_ms": 300}


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def client(url: str):
    return openai.AsyncOpenAI(api_key="none", base_url=url + "/v1",
                              websocket_base_url=url.replace("http", "ws") + "/v1/voice")


async def collect(conn, until, timeout: float = 20.0) -> list:
    """Events until ``until(event)`` is true (inclusive) or ``timeout``."""
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = await asyncio.wait_for(conn.recv(), deadline - time.monotonic())
        except TimeoutError:
            break
        out.append(ev)
        if until(ev):
            break
    return out


def silence(s: float) -> np.ndarray:
    return np.zeros(int(24000 * s), np.int16)


def test_sdk_spoken_question_audio_and_transcripts(served):
    async def main():
        with voice_server(served) as url:
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                first = await conn.recv()
                await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": VAD}}})
                updated = await conn.recv()
                audio = np.concatenate([silence(0.2), speech("what is seventeen times twenty three"), silence(5.0)])

                async def send(b):
                    await conn.input_audio_buffer.append(audio=b)
                sender = asyncio.create_task(stream_audio(send, audio))
                events = await collect(conn, lambda e: e.type == "response.done" and "391" in str(e.response.output),
                                       timeout=40)
                await sender
                return first, updated, events

    first, updated, events = run(main())
    assert first.type == "session.created" and first.session.audio.input.format.rate == 24000
    td = updated.session.audio.input.turn_detection
    assert updated.type == "session.updated" and (td.threshold, td.silence_duration_ms, td.prefix_padding_ms) == (
        0.5, 200, 300)
    types = [e.type for e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "conversation.item.input_audio_transcription.completed", "delegation.created", "response.created"]
    assert [types.index(t) for t in order] == sorted(types.index(t) for t in order)
    done = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert done.transcript == "what is 17 times 23"
    assert any(e.type == "conversation.item.input_audio_transcription.delta" for e in events)
    dlg = next(e for e in events if e.type == "delegation.result")
    assert dlg.model_extra["result"] == "391" if hasattr(dlg, "model_extra") and dlg.model_extra else True
    by_resp: dict[str, list] = {}
    for e in events:
        if e.type in ("response.output_audio.delta", "response.output_audio_transcript.delta"):
            by_resp.setdefault(e.response_id, []).append(e)
    finals = [e for e in events if e.type == "response.done"]
    assert len(finals) == 2 and all(f.response.status == "completed" for f in finals)
    for f in finals:
        deltas = by_resp[f.response.id]
        pcm = b"".join(base64.b64decode(d.delta) for d in deltas if d.type == "response.output_audio.delta")
        text = "".join(d.delta for d in deltas if d.type == "response.output_audio_transcript.delta")
        assert len(pcm) > 24000 and len(pcm) // 2 == f.response.model_extra["audio_samples"]
        assert text == f.response.output[0].content[0].transcript
        # every audio delta of a response comes between its response.created and its response.done
        i0 = next(i for i, e in enumerate(events) if e.type == "response.created" and e.response.id == f.response.id)
        i1 = events.index(f)
        assert all(i0 < i < i1 for i, e in enumerate(events) if getattr(e, "response_id", None) == f.response.id)
    assert finals[0].response.output[0].content[0].transcript.startswith(" Let me check.")
    assert finals[1].response.output[0].content[0].transcript.startswith(" The answer is 391.")


def test_sdk_barge_in_then_truncate(served):
    async def main():
        with voice_server(served) as url:
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                await conn.recv()
                await conn.session.update(session={"audio": {"input": {"turn_detection": VAD}}})
                await conn.recv()

                async def send(b):
                    await conn.input_audio_buffer.append(audio=b)
                ask = np.concatenate([silence(0.2), speech("tell me a long story about the sea"), silence(1.2)])
                events = []
                sender = asyncio.create_task(stream_audio(send, np.concatenate([ask, silence(10)])))
                events += await collect(conn, lambda e: e.type == "response.output_audio.delta")
                await asyncio.sleep(0.4)
                sender.cancel()
                interrupt = np.concatenate([speech("wait stop tell me about the moon instead"), silence(1.5)])
                await stream_audio(send, interrupt)
                events += await collect(conn, lambda e: False, timeout=1.0)
                cut = next(e for e in events if e.type == "response.done")
                await conn.conversation.item.truncate(item_id=cut.response.id, content_index=0, audio_end_ms=200)
                events += await collect(conn, lambda e: e.type in ("conversation.item.truncated", "error"), timeout=5)
                events += await collect(conn, lambda e: e.type == "response.output_audio.delta", timeout=15)
                await conn.response.cancel()  # the answer to the interruption, while it plays
                events += await collect(conn, lambda e: e.type == "response.done", timeout=5)
                await conn.response.cancel()  # nothing left
                events += await collect(conn, lambda e: e.type == "error", timeout=5)
                return events

    events = run(main())
    done = next(e for e in events if e.type == "response.done")
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    i_done = events.index(done)
    starts = [i for i, e in enumerate(events) if e.type == "input_audio_buffer.speech_started"]
    assert len(starts) >= 2 and starts[0] < i_done < starts[1]  # the interrupting speech_started comes after
    hold = next(i for i, e in enumerate(events) if e.type == "input.turn" and e.model_extra["kind"] == "hold")
    rid = done.response.id
    audio_after = [i for i, e in enumerate(events) if e.type == "response.output_audio.delta" and e.response_id == rid
                   and i > hold]
    assert not audio_after  # no audio of the old epoch once the user started speaking
    tr = next(e for e in events if e.type in ("conversation.item.truncated", "error"))
    assert tr.type == "conversation.item.truncated" and tr.item_id == rid and tr.audio_end_ms == 200
    heard = done.response.output[0].content[0].transcript
    assert heard.startswith(tr.model_extra["transcript"])  # truncating further only shortens
    second = [e for e in events if e.type == "response.done"][-1]
    assert second.response.id != rid and second.response.status == "cancelled"
    assert second.response.status_details.reason == "client_cancelled"
    err = events[-1]
    assert err.type == "error" and err.error.code == "response_cancel_not_active"


def test_sdk_manual_commit_create_and_cancel(served):
    async def main():
        with voice_server(served) as url:
            served_app_cfg = AgentConfig(max_response_tokens=400)
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                await conn.recv()
                await conn.session.update(session={"audio": {"input": {"turn_detection": None}}})
                upd = await conn.recv()
                await conn.input_audio_buffer.commit()
                empty = await conn.recv()
                for i in range(0, 24000 * 3, 4800):
                    part = speech("tell me a long story about the sea")[i:i + 4800]
                    if len(part):
                        await conn.input_audio_buffer.append(audio=base64.b64encode(part.tobytes()).decode())
                await conn.input_audio_buffer.commit()
                events = await collect(
                    conn, lambda e: e.type == "conversation.item.input_audio_transcription.completed")
                await conn.response.create()
                events += await collect(conn, lambda e: e.type == "response.output_audio.delta")
                await conn.response.cancel()
                events += await collect(conn, lambda e: e.type == "response.done")
                events += await collect(conn, lambda e: False, timeout=1.0)
                del served_app_cfg
                return upd, empty, events

    upd, empty, events = run(main())
    assert upd.session.audio.input.turn_detection is None
    assert empty.type == "error" and empty.error.code == "input_audio_buffer_commit_empty"
    types = [e.type for e in events]
    assert types[:2] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert events[types.index("conversation.item.input_audio_transcription.completed")].transcript == \
        "tell me a long story about the sea"
    done = next(e for e in events if e.type == "response.done")
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
    i = events.index(done)
    assert not [e for e in events[i + 1:] if e.type == "response.output_audio.delta"]


def test_refused_input(served):
    async def main():
        with voice_server(served) as url:
            async with client(url).realtime.connect(model=MODEL_NAME) as conn:
                await conn.recv()
                out = []
                bad = [
                    {"type": "input_audio_buffer.append", "audio": "not base64!!", "event_id": "a"},
                    {"type": "input_audio_buffer.append", "audio": "AA==", "event_id": "b"},  # one byte: not PCM16
                    {"type": "session.update", "event_id": "c", "session": {"audio": {"input": {
                        "turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}}},
                    {"type": "session.update", "event_id": "d", "session": {"audio": {"input": {
                        "format": {"type": "audio/pcm", "rate": 8000}}}}},
                    {"type": "session.update", "event_id": "e", "session": {"instructions": "x" * 5000}},
                    {"type": "session.update", "event_id": "f", "session": {"audio": {"output": {"voice": "x" * 100}}}},
                    {"type": "session.update", "event_id": "g", "session": {"nonsense": 1}},
                    {"type": "session.update", "event_id": "h", "session": {"audio": {"input": {"turn_detection": {
                        "type": "server_vad", "silence_duration_ms": 10**9}}}}},
                    {"type": "response.create", "event_id": "i", "response": {"instructions": "hi"}},
                    {"type": "conversation.item.truncate", "event_id": "j", "item_id": "nope", "audio_end_ms": 5},
                    {"type": "input_audio_buffer.append", "event_id": "k", "audio": "A" * (2 << 20)},
                ]
                for msg in bad:
                    await conn.send(msg)
                    out.append(await conn.recv())
                return out

    out = run(main())
    assert [e.type for e in out] == ["error"] * len(out)
    codes = [(e.error.event_id if hasattr(e.error, "event_id") else None, e.error.code) for e in out]
    assert [c for _, c in codes] == ["invalid", "invalid", "invalid", "invalid", "invalid", "invalid",
                                     "invalid_message", "invalid", "invalid", "not_found", "message_too_large"]


def test_a_voice_agents_front_belongs_to_its_tenant_and_is_not_a_plain_session(served):
    """For voice too: the front of a voice agent lives in its tenant's agents realm
    (held by its connection): the session API and ``/v1/realtime`` answer ``not_found`` for its id,
    and it counts against that tenant's ``agents`` quota."""
    import httpx
    from serve_helpers import running_server
    from voice_serve_helpers import engines

    from execstate.serve.app import build_app
    from execstate.serve.principals import KeyRing

    key = "voice-key-0001"
    app = build_app(served.engine, MODEL_NAME, sessions=served.sessions, voice_engines=engines,
                    keys=KeyRing.build([key]))

    async def main():
        with running_server(app) as (url, _server):
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                                          websocket_base_url=url.replace("http", "ws") + "/v1/voice").realtime.connect(
                    model=MODEL_NAME) as conn:
                created = await conn.recv()
                assert created.type == "session.created"
                await conn.send({"type": "response.create", "event_id": "r"})  # opens the agent
                for _ in range(200):
                    if app.state.voice.agents:
                        break
                    await asyncio.sleep(0.05)
                va = next(iter(app.state.voice.agents.values()))
                front_id = va.agent.front.session_id
                async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as h:
                    r = await h.get(f"{url}/v1/sessions/{front_id}")
                    d = await h.delete(f"{url}/v1/sessions/{front_id}")
                alive = va.agent.front.session_id == front_id and not va.agent._closed
                return (r.status_code, r.json()["error"]["code"]), d.status_code, alive

    got, deleted, alive = run(main())
    assert got == (404, "not_found") and deleted == 404 and alive
