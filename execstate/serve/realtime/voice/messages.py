"""Messages of the voice WebSocket (``/v1/voice/realtime``): OpenAI Realtime's audio protocol.

The official ``openai`` SDK's realtime client connects here when given ``ws://HOST/v1/voice`` as its
WebSocket base URL (it appends ``/realtime?model=...``). The session exists from the connection
on (``session.created`` is the first event). Client -> server:

=================================  ==============================================================
``session.update``                 ``session``: :class:`VoiceSession` (audio formats, server VAD
                                   knobs, voice, instructions, the speech turn policy)
``input_audio_buffer.append``      ``audio``: base64 PCM16 at the input rate (at most 1 MiB a message)
``input_audio_buffer.commit``      manual turn detection (``turn_detection: null``): the buffer is
                                   a user item
``input_audio_buffer.clear``       drop the uncommitted audio
``response.create``                answer now (with ``create_response: false`` or manual turns)
``response.cancel``                stop the reply in flight (generating or playing)
``conversation.item.truncate``     ``item_id``, ``audio_end_ms``: the client played this much
``conversation.item.create``       ``item``: a user message of ``input_text`` parts (typed, not
                                   spoken): a user turn, answered at ``response.create``
=================================  ==============================================================

Fields OpenAI defines that this server does not act on are accepted and ignored when they keep
their neutral value (``tools: []``, ``tracing``, ``include``...), and refused (``invalid``)
otherwise; unknown fields are refused (``invalid_message``). Every size is bounded (below).
Phases: ``ACTIVE`` (from the connection on) -> ``ENDED`` when the agent stopped by itself (its
``error`` said why: everything is refused with ``session_ended``) -> ``GONE`` on disconnect.
"""

from __future__ import annotations

from typing import Any

import msgspec

from execstate.serve.realtime.errors import EventId
from execstate.serve.realtime.limits import Limits
from execstate.serve.realtime.messages import Message, MessageTable
from execstate.serve.realtime.phases import Move, Phase, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol

MAX_AUDIO_B64 = 1 << 20  # one append (the message bound: ~16 s of 24 kHz audio)
MAX_TEXT_CHARS = 2048  # instructions
MAX_NAME_CHARS = 64  # voice, model, ids
MAX_PROMPT_CHARS = 1024  # transcription.prompt


class _Obj(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class AudioFormat(_Obj):
    type: str = "audio/pcm"
    rate: int = 24000


class TurnDetection(_Obj):
    """OpenAI's ``server_vad`` and ``semantic_vad`` knobs, plus what this server's speech turn
    policy adds. ``semantic_vad``: the front model scores the end of the user's turn
    (``eagerness`` low / medium / high / auto sets the score threshold and the silences:
    ``convert.eagerness_table``: the end-of-turn probe's thresholds when the agents score with it,
    else ``convert.EAGERNESS``; ``end_of_turn_threshold``, ``silence_duration_ms`` (the short silence)
    and ``end_of_turn_silence_ms`` (the long one) override them)."""

    type: str = "server_vad"
    eagerness: str | None = None  # semantic_vad
    end_of_turn_threshold: float | None = None  # execstate, semantic_vad
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None  # accepted: null only
    # execstate: the silence that ends a segment whose words end a sentence (voice/vad.py; -1: never)
    sentence_end_silence_ms: int | None = None
    # execstate: agent/speech_turns.py's SpeechTurnConfig
    end_of_turn_silence_ms: int | None = None
    backchannel_max_ms: int | None = None
    backchannel_max_words: int | None = None
    resume_after_ms: int | None = None


class Transcription(_Obj):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioIn(_Obj):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None | msgspec.UnsetType = msgspec.UNSET
    noise_reduction: dict[str, Any] | None = None


class AudioOut(_Obj):
    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = None


class Audio(_Obj):
    input: AudioIn | None = None
    output: AudioOut | None = None


class VoiceSession(_Obj):
    type: str | None = None  # "realtime"
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None
    audio: Audio | None = None
    tools: list[dict[str, Any]] | None = None  # function tools: not served (only [] accepted)
    tool_choice: str | None = None
    max_output_tokens: int | str | None = None
    tracing: Any = None
    truncation: Any = None
    include: list[str] | None = None
    prompt: Any = None


class SessionUpdate(Message, tag="session.update"):
    session: VoiceSession
    event_id: EventId = None


class AudioAppend(Message, tag="input_audio_buffer.append"):
    audio: str
    event_id: EventId = None


class AudioCommit(Message, tag="input_audio_buffer.commit"):
    event_id: EventId = None


class AudioClear(Message, tag="input_audio_buffer.clear"):
    event_id: EventId = None


class ResponseCreate(Message, tag="response.create"):
    response: dict[str, Any] | None = None  # per-response overrides: not served (only {} / null)
    event_id: EventId = None


class ResponseCancel(Message, tag="response.cancel"):
    response_id: str | None = None
    event_id: EventId = None


class ItemTruncate(Message, tag="conversation.item.truncate"):
    item_id: str
    audio_end_ms: int
    content_index: int = 0
    event_id: EventId = None


class ContentPart(_Obj):
    type: str
    text: str | None = None


class NewItem(_Obj):
    type: str = "message"
    role: str = "user"
    content: list[ContentPart] = msgspec.field(default_factory=list)
    id: str | None = None


class ItemCreate(Message, tag="conversation.item.create"):
    item: NewItem
    previous_item_id: str | None = None
    event_id: EventId = None


MESSAGES = MessageTable(SessionUpdate, AudioAppend, AudioCommit, AudioClear, ResponseCreate, ResponseCancel,
                        ItemTruncate, ItemCreate, max_event_id_chars=MAX_NAME_CHARS)

ACTIVE = Phase("active")
ENDED = Phase("ended", allow=frozenset(), otherwise=Refusal(
    "session_ended", "{type}: voice session {session_id!r} has stopped (see its error event); reconnect"))
END = Move("end", frozenset({ACTIVE}), ENDED)
PHASES = PhaseTable(ACTIVE, (ACTIVE, ENDED), (END,), values=("session_id",))

VOICE_PROTOCOL = RealtimeProtocol("voice", MESSAGES, PHASES, Limits(max_message_bytes=MAX_AUDIO_B64 + 4096))
