"""The events a voice agent emits (``VoiceAgent.events()``), beside the runtime's own.

``VoiceAgent`` passes the runtime's turn, delegation and error events through
(``agent/agent_events.py``) and replaces its text response events by audio ones: an audio
response is open from its first audio to its last (``response.done`` comes after the last audio
delta), so it outlives the text response that produced it. ``type`` strings are the OpenAI
Realtime server events they become on the wire. Every event carries ``t`` (the agent clock) and
``epoch`` (the front epoch; no audio delta of an epoch follows a barge-in that ended it).
Positions in the input audio (``audio_start_ms``, ``audio_end_ms``) count from the first sample
the agent received.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from execstate.agent.agent_events import AgentEvent


@dataclass(frozen=True)
class SpeechStarted(AgentEvent):
    type = "input_audio_buffer.speech_started"
    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped(AgentEvent):
    type = "input_audio_buffer.speech_stopped"
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class InputCommitted(AgentEvent):
    type = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True)
class InputCleared(AgentEvent):
    type = "input_audio_buffer.cleared"


@dataclass(frozen=True)
class InputTranscriptDelta(AgentEvent):
    """The recognizer's hypothesis grew: ``delta`` is the new text after what earlier deltas gave
    (a revised hypothesis sends only what extends the old one); ``partial`` is all of it now."""

    type = "conversation.item.input_audio_transcription.delta"
    item_id: str
    delta: str
    partial: str


@dataclass(frozen=True)
class InputTranscriptCompleted(AgentEvent):
    type = "conversation.item.input_audio_transcription.completed"
    item_id: str
    transcript: str


@dataclass(frozen=True)
class AudioResponseCreated(AgentEvent):
    type = "response.created"
    response_id: str
    cause: str


@dataclass(frozen=True)
class AudioDelta(AgentEvent):
    """``samples`` (int16 at the agent's output rate) start ``offset`` samples into the response."""

    type = "response.output_audio.delta"
    response_id: str
    samples: np.ndarray
    offset: int


@dataclass(frozen=True)
class AudioTranscriptDelta(AgentEvent):
    """Text of the response, sent with the audio that speaks it (``offset``: the sample where its
    first word starts)."""

    type = "response.output_audio_transcript.delta"
    response_id: str
    delta: str
    offset: int


@dataclass(frozen=True)
class AudioResponseDone(AgentEvent):
    """``status``: ``completed``, ``cancelled`` or ``failed``; ``transcript``: what its audio spoke
    (for a cancelled one: what was played, whole words); ``audio_samples``: the audio sent."""

    type = "response.done"
    response_id: str
    status: str
    reason: str
    transcript: str
    audio_samples: int


@dataclass(frozen=True)
class ItemTruncated(AgentEvent):
    type = "conversation.item.truncated"
    item_id: str
    audio_end_ms: int
    kept_text: str


@dataclass(frozen=True)
class ItemAdded(AgentEvent):
    """A typed user message entered the conversation (``conversation.item.create``)."""

    type = "conversation.item.added"
    item_id: str
    previous_item_id: str | None
    text: str


@dataclass(frozen=True)
class EndScore(AgentEvent):
    """The front model scored the user's turn so far (``agent/prefill.py``): ``p_end``, the
    probability that it ends there (the end-of-turn probe's, or the end tokens' mass: what the
    turn policy reads); ``p_mass``: the end tokens' mass; ``prefilled``: tokens the speculative
    steps computed so far."""

    type = "input.end_score"
    item_id: str | None
    text: str
    p_end: float
    prefilled: int
    p_mass: float | None = None
