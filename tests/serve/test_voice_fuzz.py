"""Random message streams on a voice connection (``/v1/voice/realtime``'s handlers on the
framework's ``Connection``, no socket): settings valid and not, audio of speech, noise and silence,
bad base64, commits, clears, responses, cancels and truncates, at random moments. The voice agent
is real (Silero VAD, PocketSphinx on the demo phrases, eSpeak) over the scripted text front
(tests/agent/agent_fakes.py). Never an internal error; every refusal carries its message's
event_id; every response is created once and done once, with no audio after its done; closing
releases the agent, its front and its recognizer stream."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voice_serve_helpers import engines, speech

from execstate.agent.duplex import DuplexAgent
from execstate.agent.prefill import PrefillStats
from execstate.serve.realtime.connection import Connection
from execstate.serve.realtime.voice.handlers import VoiceHandlers, VoiceServer
from execstate.serve.realtime.voice.messages import VOICE_PROTOCOL
from execstate.voice.agent import VoiceAgent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import FakeFront  # noqa: E402

_SPEECH: list[np.ndarray] = []


def spoken() -> np.ndarray:
    if not _SPEECH:
        _SPEECH.append(speech("what is the code of zebra"))
    return _SPEECH[0]


class FakeVoiceServer:
    """What ``VoiceHandlers`` needs of ``VoiceServer``: engines, agents, a model name; the front is fake."""

    def __init__(self) -> None:
        self.ctx = SimpleNamespace(served_model_name="fake")
        self.agents: dict[str, VoiceAgent] = {}
        self.prefill = PrefillStats()
        self.opened: list[VoiceAgent] = []
        self.fronts: list[FakeFront] = []
        self.probe = None  # the fake front is no LM session: its agents score with the end tokens' mass

    check_model = VoiceServer.check_model  # the real check, on this server's model name

    async def end_probe(self):
        return self.probe

    def engines(self):
        return engines()

    async def open_agent(self, instructions, cfg, tenant):
        e = engines()
        front = FakeFront(reply=" one two three four five.", token_delay=0.002, prelude=instructions)
        va = VoiceAgent(DuplexAgent(front), e.recognizer, e.synthesizer, e.detector(), cfg)
        await va.start()
        self.fronts.append(front)
        self.opened.append(va)
        return va, f"front-{len(self.fronts)}"


def b64(x: np.ndarray) -> str:
    return base64.b64encode(x.astype("<i2").tobytes()).decode()


AUDIO = st.sampled_from(["speech", "silence", "noise", "bad", "odd", "empty"])
TD = st.one_of(st.none(), st.fixed_dictionaries({"type": st.sampled_from(["server_vad", "semantic_vad", "x"])},
                                                optional={"threshold": st.sampled_from([0.5, 2.0]),
                                                          "silence_duration_ms": st.sampled_from([100, -5]),
                                                          "eagerness": st.sampled_from(["low", "high", "max"])}))
UPDATE = st.builds(lambda td, rate, voice, instr: {"type": "session.update", "session": {
    **({"instructions": instr} if instr else {}),
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}, "turn_detection": td},
              "output": {"voice": voice}}}},
    TD, st.sampled_from([16000, 24000, 8000]), st.sampled_from(["en-us", "nope"]), st.sampled_from(["", "Be brief."]))
UPDATE = st.one_of(UPDATE, st.sampled_from([{"type": "session.update", "session": {"model": "fake"}},
                                            {"type": "session.update", "session": {"model": "gpt-realtime"}}]))
MESSAGES = st.one_of(
    UPDATE,
    AUDIO.map(lambda a: {"type": "input_audio_buffer.append", "audio": a}),
    AUDIO.map(lambda a: {"type": "input_audio_buffer.append", "audio": a}),
    st.just({"type": "input_audio_buffer.commit"}),
    st.sampled_from([{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what is 12 times 11"}]}},
        {"type": "conversation.item.create", "item": {"type": "message", "role": "assistant", "content": []}},
        {"type": "conversation.item.create", "item": {"type": "function_call"}}]),
    st.just({"type": "input_audio_buffer.clear"}),
    st.sampled_from([{"type": "response.create"}, {"type": "response.create", "response": {"x": 1}}]),
    st.just({"type": "response.cancel"}),
    st.builds(lambda item, ms, ci: {"type": "conversation.item.truncate", "item_id": item, "audio_end_ms": ms,
                                    "content_index": ci},
              st.sampled_from(["resp_1", "resp_2", "x"]), st.sampled_from([0, 300, -1, 10**9]),
              st.sampled_from([0, 1])),
    st.sampled_from(['{"type": "input_audio_buffer.append"}', "[]", '{"type": "nope"}', "\x00", "{"]),
)


def _audio(kind: str, rate: int) -> str:
    if kind == "speech":
        x = spoken() if rate == 24000 else spoken()[::3][: len(spoken()) * 2 // 3]
        return b64(np.concatenate([x, np.zeros(rate // 2, np.int16)]))
    if kind == "silence":
        return b64(np.zeros(rate // 5, np.int16))
    if kind == "noise":
        return b64(np.random.default_rng(0).integers(-4000, 4000, rate // 5).astype(np.int16))
    return {"bad": "not base64!", "odd": base64.b64encode(b"abc").decode(), "empty": ""}[kind]


def check_responses(events: list[dict[str, Any]]) -> None:
    state: dict[str, str] = {}
    for e in events:
        t = e["type"]
        if t == "response.created":
            assert e["response"]["id"] not in state
            state[e["response"]["id"]] = "open"
        elif t in ("response.output_audio.delta", "response.output_audio_transcript.delta"):
            assert state.get(e["response_id"]) == "open", e
        elif t == "response.done":
            assert state.get(e["response"]["id"]) == "open", e
            state[e["response"]["id"]] = "done"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(MESSAGES, st.floats(0, 0.2)), min_size=1, max_size=10))
def test_random_voice_message_streams_never_break_the_connection(script):
    async def main():
        server = FakeVoiceServer()
        events: list[dict[str, Any]] = []

        async def emit(ev):
            events.append(ev)

        conn = Connection(VOICE_PROTOCOL, lambda peer: VoiceHandlers(peer, server), emit)
        rate = 24000
        for i, (msg, pause) in enumerate(script):
            if isinstance(msg, dict):
                msg = dict(msg, event_id=f"m{i}")
                if msg["type"] == "input_audio_buffer.append":
                    msg["audio"] = _audio(msg["audio"], rate)
                n = len(events)
                await conn.handle(json.dumps(msg))
                if msg["type"] == "session.update" and "audio" in msg["session"] and any(
                        e["type"] == "session.updated" for e in events[n:]):
                    rate = msg["session"]["audio"]["input"]["format"]["rate"]
            else:
                await conn.handle(msg)
            await asyncio.sleep(pause)
        await asyncio.sleep(0.3)
        conn.disconnected()
        await conn.close()
        # session.created comes before any other answer but the refusal of an unreadable frame (the
        # framework answers those before the handlers' first event)
        assert [e["type"] for e in events if e["type"] != "error"][0] == "session.created"
        assert sum(e["type"] == "session.created" for e in events) == 1
        errors = [e for e in events if e["type"] == "error"]
        assert all(e["error"]["type"] != "server_error" for e in errors), errors
        sent_ids = {f"m{i}" for i, (m, _) in enumerate(script) if isinstance(m, dict)}
        assert all(e["event_id"] is None or e["event_id"] in sent_ids for e in errors)
        if any(not isinstance(m, dict) for m, _ in script):  # a refused frame without an id: answered without one
            assert any(e["event_id"] is None for e in errors)
        check_responses(events)
        assert server.agents == {}
        assert all(f.closed for f in server.fronts)
        assert all(va.input is None or va.input.stream._d is None for va in server.opened)

    asyncio.run(asyncio.wait_for(main(), 120))
