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
