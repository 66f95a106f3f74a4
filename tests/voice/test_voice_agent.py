"""VoiceAgent end to end in real time: real eSpeak speech in, Silero VAD, PocketSphinx (demo
phrases), the runtime over a scripted text front, eSpeak out. What the agent says is checked by
recognising its audio."""

from __future__ import annotations

import asyncio

import numpy as np
from voice_helpers import LONG_REPLY, converse, heard_number, make_agent, says_number, speech16k

from execstate.voice.agent import VoiceConfig
from execstate.voice.vad import VadConfig

QUESTION = "what is seventeen times twenty three"


def test_question_delegated_and_391_spoken() -> None:
    va, front = make_agent(reply=" Sure.", tool_delay=0.3)
    rec = asyncio.run(converse(va, [(0.3, speech16k(QUESTION))], tail_s=6.0))
    types = rec.types()
    i = types.index("input_audio_buffer.speech_started")
    assert types[i:i + 4] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                              "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed"]
    assert rec.of("conversation.item.input_audio_transcription.completed")[0].transcript == "what is 17 times 23"
    assert len(rec.of("conversation.item.input_audio_transcription.delta")) >= 3  # streamed partials
    dlg = rec.of("delegation.created")[0]
    assert dlg.arguments == {"expression": "17 times 23"}
    assert rec.of("delegation.result")[0].result == "391"
    done = rec.of("response.done")
    assert [d.status for d in done] == ["completed", "completed"]
    ack, answer = done
    assert ack.transcript.startswith(" Let me check.") and "391" in answer.transcript
    # the answer's audio says it: the audio of the word "391" recognised back (numbers only)
    assert says_number(heard_number(rec, answer.response_id, "391"), 391)
    assert answer.audio_samples == len(rec.audio(answer.response_id)) > 24000 // 2
    # responses play one after the other: created, deltas, done, then the next
    order = [(e.type, getattr(e, "response_id", None)) for _, e in rec.events
             if e.type in ("response.created", "response.done", "response.output_audio.delta")]
    ids = [rid for _, rid in order]
    assert ids == sorted(ids, key=lambda r: (r != ack.response_id, r)) and ids.count(ack.response_id) > 2
    assert "User: what is 17 times 23" in front.text


def test_barge_in_stops_audio_and_cuts_the_reply_where_playback_stopped() -> None:
    va, front = make_agent(reply=LONG_REPLY)
    script = [(0.3, speech16k("tell me a long story about the sea")),
              (5.5, speech16k("wait stop, tell me about the moon instead"))]
    rec = asyncio.run(converse(va, script, tail_s=2.0))
    done = rec.of("response.done")
    first = done[0]
    assert first.status == "cancelled" and first.reason == "barge_in"
    # the interrupting speech_started comes after the cancelled reply's response.done
    evs = [e for _, e in rec.events]
    i_done = evs.index(first)
    i_hold = next(i for i, e in enumerate(evs) if e.type == "input.turn" and e.kind == "hold")
    starts = [i for i, e in enumerate(evs) if e.type == "input_audio_buffer.speech_started"]
    assert len(starts) >= 2 and i_hold < i_done < starts[1]  # (the comma's pause may split the turn's items)
    # no audio of the old epoch after the barge-in; the cut transcript is what had played at the hold
    old = [i for i, e in enumerate(evs) if e.type == "response.output_audio.delta" and e.epoch == first.epoch]
    assert old and max(old) < i_hold
    t_start = next(e.t for e in evs if e.type == "response.output_audio.delta" and e.response_id == first.response_id)
    played_s = evs[i_hold].t - t_start
    cut = first.transcript
    assert LONG_REPLY.startswith(cut) and 3 <= len(cut.split()) < len(LONG_REPLY.split())
    spoken = sum(len(e.samples) for e in evs if e.type == "response.output_audio.delta" and
                 e.response_id == first.response_id) / 24000
    assert played_s <= spoken <= played_s + 0.25  # audio was sent at most lead_ms (+ one chunk) ahead
    # the runtime's context holds the played words only, then the new turn
    assert f"Agent:{cut}\nUser: wait stop tell me about the moon instead" in front.text
    assert [e.text for e in rec.of("input.turn") if e.kind == "end_of_turn"] == [
        "tell me a long story about the sea", "wait stop tell me about the moon instead"]


def test_backchannel_holds_then_resumes_the_same_reply() -> None:
    va, _front = make_agent(reply=LONG_REPLY)
    script = [(0.3, speech16k("tell me a long story about the sea")), (5.0, speech16k("yeah"))]
    rec = asyncio.run(converse(va, script, tail_s=5.0))
    turns = [e.kind for e in rec.of("input.turn")]
    assert turns == ["end_of_turn", "hold", "resume"]
    assert len(rec.of("input_audio_buffer.speech_started")) == 1  # the backchannel is no user item
    first = rec.of("response.done")[0]
    assert first.response_id == rec.of("response.created")[0].response_id
    assert first.reason != "barge_in"
    evs = [e for _, e in rec.events]
    hold = next(e for e in evs if e.type == "input.turn" and e.kind == "hold")
    resume = next(e for e in evs if e.type == "input.turn" and e.kind == "resume")
    paused = [e for e in evs if e.type == "response.output_audio.delta" and hold.t < e.t < resume.t]
    assert not paused  # no audio sent while held
    assert resume.t - hold.t < 2.0
    after = [e for e in evs if e.type == "response.output_audio.delta" and e.t > resume.t]
    assert after and after[0].response_id == first.response_id  # the same reply continues


def test_manual_commit_and_24k_input() -> None:
    va, front = make_agent(reply=" Fine.", config=VoiceConfig(in_rate=24000, vad=None, create_response=False))

    async def run():
        await va.start()
        x16 = speech16k("tell me a long story about the sea")
        from execstate.voice.resample import resample
        x = resample(np.concatenate([x16, np.zeros(4800, np.int16)]), 16000, 24000)
        for i in range(0, len(x), 4800):
            await va.append(x[i:i + 4800])
        item = await va.commit()
        assert await va.commit() is None  # empty buffer
        await asyncio.sleep(0.5)
        assert "User: tell me a long story about the sea" in front.text or not va.agent.fence.active
        va.create_response()
        events = []

        async def read():
            async for ev in va.events():
                events.append(ev)
                if ev.type == "response.done":
                    return
        await asyncio.wait_for(read(), 20)
        await va.close()
        return item, events

    item, events = asyncio.run(run())
    types = [e.type for e in events]
    assert types[:2] == ["input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed"]
    assert events[1].item_id == item and events[1].transcript == "tell me a long story about the sea"
    assert "response.created" in types and events[-1].status == "completed"
    assert sum(len(e.samples) for e in events if e.type == "response.output_audio.delta") > 0


def test_cancel_and_truncate() -> None:
    va, front = make_agent(reply=LONG_REPLY)

    async def run():
        rec_task = asyncio.ensure_future(converse(va, [(0.3, speech16k("tell me a long story about the sea"))],
                                                  tail_s=8.0))
        while not va.out.response("resp_1") or va.out.response("resp_1").sent < 24000 * 2:
            await asyncio.sleep(0.05)
        kept = va.truncate("resp_1", 1500)  # the client played 1.5 s
        rec = await rec_task
        return kept, rec

    kept, rec = asyncio.run(run())
    done = rec.of("response.done")[0]
    assert done.status == "cancelled" and done.reason == "truncated"
    tr = rec.of("conversation.item.truncated")[0]
    assert tr.item_id == "resp_1" and tr.audio_end_ms == 1500 and tr.kept_text == kept
    assert LONG_REPLY.startswith(kept) and 1 <= len(kept.split()) <= 6
    context = "".join(map(chr, va.agent.transcript.token_ids))  # the runtime's context (applied at its next step)
    assert context.endswith(f"Agent:{kept}")
    va2, _ = make_agent()
    assert VadConfig().silence_duration_ms == 200 and va2.config.vad is not None
