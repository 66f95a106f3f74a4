"""The listener (``voice/listener.py``) over the scripted text front: what the agent and the turn
policy get from the input events (pure bookkeeping: no audio, no model)."""

from __future__ import annotations

import sys
from pathlib import Path

from execstate.agent.duplex import DuplexAgent
from execstate.agent.speech_turns import SpeechTurnConfig, SpeechTurnPolicy
from execstate.voice.audio_input import Final, Partial, Progress, VadStart, VadStop
from execstate.voice.listener import Listener

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import FakeFront  # noqa: E402


class _Silent:
    """SpeechOut as the listener sees it, with nothing playing."""

    def audible(self) -> bool:
        return False


def test_the_agent_gets_the_words_without_the_recognizers_final_mark_and_the_client_gets_them_all():
    agent = DuplexAgent(FakeFront())
    turns = SpeechTurnPolicy(SpeechTurnConfig(end_threshold=0.35))
    events = []
    listener = Listener(agent, _Silent(), turns, events.append, lambda: True)  # type: ignore[arg-type]
    listener.on_input(VadStart(8000, 3200))
    listener.on_input(Partial("Tell me along."))  # a punctuating recognizer, in a pause of the sentence
    assert agent.prefill.partial == "Tell me along"
    listener.on_input(Progress(1.2, 0.0))
    listener.on_input(Partial("Tell me a long story about the sea?"))
    assert agent.prefill.partial == "Tell me a long story about the sea"
    listener.on_input(VadStop(40000, 43200))
    listener.on_input(Final("Tell me a long story about the sea.", 3200, 43200))
    assert agent.prefill.partial == "Tell me a long story about the sea"
    done = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert [e.transcript for e in done] == ["Tell me a long story about the sea."]


def test_words_the_recognizer_heard_again_with_the_turns_earlier_segments_replace_theirs():
    now = [0.0]
    agent = DuplexAgent(FakeFront(), clock=lambda: now[0])
    turns = SpeechTurnPolicy(SpeechTurnConfig(end_threshold=0.35, end_of_turn_silence_s=0.8))
    events, ended = [], []
    listener = Listener(agent, _Silent(), turns, events.append, lambda: False,  # type: ignore[arg-type]
                        end_context=lambda: ended.append(agent.now()))
    listener.on_input(VadStart(8000, 3200))
    listener.on_input(VadStop(20000, 24000))
    listener.on_input(Final("Tell me along.", 3200, 24000))
    assert agent.prefill.partial == "Tell me along"
    listener.on_input(VadStart(35000, 30200))  # after a pause: the recognizer hears both segments
    listener.on_input(Partial("story about", (3200, "Tell me a long story about")))
    assert agent.prefill.partial == "Tell me a long story about"
    listener.on_input(VadStop(50000, 54000))
    listener.on_input(Final("story about trains.", 30200, 54000, (3200, "Tell me a long story about trains.")))
    assert agent.prefill.partial == "Tell me a long story about trains"
    done = [e.transcript for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert done == ["Tell me along.", "story about trains."]  # each segment's transcript: its own words
    assert ended == []
    now[0] = 2.0  # the long silence passed: the turn ends, and the recognizer is told
    listener.tick()
    assert ended == [2.0]


def test_a_rehearing_that_starts_outside_the_turns_segments_is_not_taken():
    w = Listener.with_segment
    turn = [(3200, "Tell me along.")]
    assert w(turn, 30200, "story.", (3200, "Tell me a long story.")) == [(3200, "Tell me a long story.")]
    assert w(turn, 30200, "story.", None) == [*turn, (30200, "story.")]
    assert w(turn, 30200, "story.", (1000, "Hi. Tell me a long story.")) == [*turn, (30200, "story.")]  # a turn before
    assert w([], 30200, "story.", (3200, "Tell me a long story.")) == [(30200, "story.")]
    merged = [(3200, "Could you tell me something nice?")]  # the second segment's words are in the first's
    assert w(merged, 60000, "About trains.", (30200, "me something nice about trains")) == [
        *merged, (60000, "About trains.")]
    assert w(turn, 30200, "seventeen", (3200, "what is seventeen")) == [(3200, "what is 17")]
