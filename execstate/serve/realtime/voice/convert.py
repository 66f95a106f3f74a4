"""Voice messages <-> voice agent values: ``session`` settings -> ``VoiceConfig`` (validated and
bounded, before anything is applied), voice agent events -> OpenAI Realtime server events.

Inbound raises ``SessionEventError("invalid", ...)`` naming the field. Outbound: one agent event
may become several wire events (a response's start is ``response.created`` then
``response.output_item.added``; its end the audio and transcript ``.done`` events, then
``response.done``). Event ids of the server's own events are ``event_<n>`` per connection.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from execstate.agent.agent_events import (
    AgentEvent,
    DelegationCreated,
    DelegationResult,
    ErrorEvent,
    TurnEvent,
)
from execstate.agent.end_probe import EndProbe
from execstate.agent.speech_turns import SpeechTurnConfig
from execstate.serve.realtime.errors import error_event
from execstate.serve.realtime.voice.messages import (
    MAX_NAME_CHARS,
    MAX_PROMPT_CHARS,
    MAX_TEXT_CHARS,
    AudioFormat,
    TurnDetection,
    VoiceSession,
)
from execstate.session.runtime.events import SessionEventError
from execstate.voice import events as ve
from execstate.voice.agent import RATES, VoiceConfig
from execstate.voice.vad import VadConfig

REASONS = {"barge_in": "turn_detected", "cancel": "client_cancelled", "truncated": "client_cancelled"}
# semantic_vad's eagerness: (end score threshold, short silence ms, long silence ms). The thresholds
# were chosen on smollm2-135m's scores of finished turns and of mid-sentence pauses (docs/voice.md).
EAGERNESS = {"low": (0.5, 300, 1500), "medium": (0.35, 200, 1000), "high": (0.2, 150, 700)}
EAGERNESS["auto"] = EAGERNESS["medium"]


def eagerness_table(probe: EndProbe | None) -> dict[str, tuple[float, int, int]]:
    """eagerness -> (end threshold, short silence ms, long silence ms): ``EAGERNESS`` for the end
    tokens' mass; with the end-of-turn probe (``agent/end_probe.py``) its thresholds, chosen on its
    training data, and the same silences."""
    if probe is None:
        return EAGERNESS
    return {k: (probe.threshold(k), short, long) for k, (_, short, long) in EAGERNESS.items()}


def invalid(message: str) -> SessionEventError:
    return SessionEventError("invalid", message)


def _rate(fmt: AudioFormat | None, where: str, current: int) -> int:
    if fmt is None:
        return current
    if fmt.type != "audio/pcm" or fmt.rate not in RATES:
        raise invalid(f"session.audio.{where}.format: only audio/pcm (PCM16) at {RATES} Hz, got {fmt.type} {fmt.rate}")
    return fmt.rate


def _ms(v: int | None, where: str, lo: int, hi: int) -> int | None:
    if v is not None and not lo <= v <= hi:
        raise invalid(f"session.audio.input.turn_detection.{where} must be in [{lo}, {hi}], got {v}")
    return v


def _vad(td: TurnDetection, base: VoiceConfig, probe: EndProbe | None) -> tuple[VadConfig, SpeechTurnConfig, bool]:
    if td.type not in ("server_vad", "semantic_vad"):
        raise invalid("session.audio.input.turn_detection.type: server_vad, semantic_vad (or null), "
                      f"got {td.type[:MAX_NAME_CHARS]!r}")
    semantic = td.type == "semantic_vad"
    if not semantic and (td.eagerness is not None or td.end_of_turn_threshold is not None):
        raise invalid("session.audio.input.turn_detection: eagerness and end_of_turn_threshold are semantic_vad's")
    if semantic and td.eagerness not in (None, *EAGERNESS):
        raise invalid(f"session.audio.input.turn_detection.eagerness: one of {sorted(EAGERNESS)}, "
                      f"got {str(td.eagerness)[:MAX_NAME_CHARS]!r}")
    thr = td.end_of_turn_threshold
    if thr is not None and not (math.isfinite(thr) and 0 < thr <= 1):
        raise invalid(f"session.audio.input.turn_detection.end_of_turn_threshold must be in (0, 1], got {thr}")
    if td.idle_timeout_ms is not None:
        raise invalid("session.audio.input.turn_detection.idle_timeout_ms is not supported (null only)")
    if td.threshold is not None and not (math.isfinite(td.threshold) and 0 < td.threshold < 1):
        raise invalid(f"session.audio.input.turn_detection.threshold must be in (0, 1), got {td.threshold}")
    vad = base.vad or VadConfig()
    changes: dict[str, Any] = {}
    if semantic:
        p, short_ms, long_ms = eagerness_table(probe)[td.eagerness or "auto"]
        vad = dataclasses.replace(vad, silence_duration_ms=short_ms, sentence_end_silence_ms=None)
        changes = {"end_threshold": thr if thr is not None else p, "semantic_silence_s": short_ms / 1000,
                   "end_of_turn_silence_s": long_ms / 1000, "graded_wait": probe is None}
    elif base.turns.end_threshold is not None:  # back to server_vad: no end score
        changes = {"end_threshold": None}
    given: dict[str, Any] = {k: v for k, v in (
        ("threshold", td.threshold), ("prefix_padding_ms", _ms(td.prefix_padding_ms, "prefix_padding_ms", 0, 5000)),
        ("silence_duration_ms", _ms(td.silence_duration_ms, "silence_duration_ms", 0, 10_000))) if v is not None}
    vad = dataclasses.replace(vad, **given)
    if td.sentence_end_silence_ms is not None:
        v = _ms(td.sentence_end_silence_ms, "sentence_end_silence_ms", -1, 10_000)
        vad = dataclasses.replace(vad, sentence_end_silence_ms=None if v == -1 else v)
    t = base.turns
    if semantic and td.silence_duration_ms is not None:
        changes["semantic_silence_s"] = td.silence_duration_ms / 1000
    for name, field, lo, hi in (("end_of_turn_silence_ms", "end_of_turn_silence_s", 50, 10_000),
                                ("backchannel_max_ms", "backchannel_max_s", 50, 10_000),
                                ("resume_after_ms", "resume_after_s", 50, 10_000)):
        v = _ms(getattr(td, name), name, lo, hi)
        if v is not None:
            changes[field] = v / 1000
    if td.backchannel_max_words is not None:
        changes["backchannel_max_words"] = _ms(td.backchannel_max_words, "backchannel_max_words", 0, 100)
    if td.interrupt_response is not None:
        changes["interrupt"] = td.interrupt_response
    create = base.create_response if td.create_response is None else td.create_response
    try:
        return vad, dataclasses.replace(t, **changes), create
    except ValueError as exc:
        raise invalid(f"session.audio.input.turn_detection: {exc}") from None


def voice_config(s: VoiceSession, base: VoiceConfig, voices: set[str], probe: EndProbe | None = None) -> VoiceConfig:
    """``base`` with what ``s`` sets (absent fields kept); the neutral-only fields checked.
    ``probe``: the end-of-turn probe the agents score with (None: the end tokens' mass), which
    sets ``semantic_vad``'s thresholds (``eagerness_table``) and turns the graded wait off."""
    if s.type not in (None, "realtime"):
        raise invalid(f"session.type: only 'realtime', got {s.type!r}")
    if s.output_modalities not in (None, ["audio"]):
        raise invalid(f"session.output_modalities: only ['audio'], got {s.output_modalities!r}")
    if s.tools not in (None, []):
        raise invalid("session.tools: function tools are not served here (delegations run the server's tools)")
    if s.tool_choice not in (None, "auto", "none") or s.prompt is not None:
        raise invalid("session.tool_choice / session.prompt are not supported")
    if len(s.instructions or "") > MAX_TEXT_CHARS or len(s.model or "") > MAX_NAME_CHARS:
        raise invalid(f"session.instructions is at most {MAX_TEXT_CHARS} characters, session.model {MAX_NAME_CHARS}")
    cfg: dict[str, Any] = {}
    a = s.audio
    if a is not None and a.input is not None:
        i = a.input
        cfg["in_rate"] = _rate(i.format, "input", base.in_rate)
        if i.transcription is not None and len(i.transcription.prompt or "") > MAX_PROMPT_CHARS:
            raise invalid(f"session.audio.input.transcription.prompt is at most {MAX_PROMPT_CHARS} characters")
        if i.turn_detection is None:
            cfg["vad"] = None
        elif isinstance(i.turn_detection, TurnDetection):
            cfg["vad"], cfg["turns"], cfg["create_response"] = _vad(i.turn_detection, base, probe)
    if a is not None and a.output is not None:
        o = a.output
        cfg["out_rate"] = _rate(o.format, "output", base.out_rate)
        if o.voice is not None:
            if o.voice not in voices:
                raise invalid(f"session.audio.output.voice: {o.voice[:MAX_NAME_CHARS]!r} is not one of "
                              f"{sorted(voices)}")
            cfg["voice"] = o.voice
        if o.speed not in (None, 1.0):
            raise invalid("session.audio.output.speed: only 1.0")
    try:
        return dataclasses.replace(base, **cfg)
    except (ValueError, TypeError) as exc:
        raise invalid(f"session: {exc}") from None


def decode_audio(b64: str) -> bytes:
    try:
        data = base64.b64decode(b64, validate=True)
    except ValueError:
        raise invalid("input_audio_buffer.append: audio must be base64 (PCM16 little-endian)") from None
    if len(data) % 2:
        raise invalid("input_audio_buffer.append: PCM16 audio has an even number of bytes")
    return data


def session_json(sid: str, model: str, instructions: str, cfg: VoiceConfig,
                 probe: EndProbe | None = None) -> dict[str, Any]:
    td: dict[str, Any] | None = None
    if cfg.vad is not None:
        t = cfg.turns
        td = {"type": "server_vad" if t.end_threshold is None else "semantic_vad",
              "threshold": cfg.vad.threshold, "prefix_padding_ms": cfg.vad.prefix_padding_ms,
              "silence_duration_ms": cfg.vad.silence_duration_ms, "create_response": cfg.create_response,
              "sentence_end_silence_ms": -1 if cfg.vad.sentence_end_silence_ms is None
              else cfg.vad.sentence_end_silence_ms,
              "interrupt_response": t.interrupt, "idle_timeout_ms": None,
              "end_of_turn_silence_ms": round(t.end_of_turn_silence_s * 1000),
              "backchannel_max_ms": round(t.backchannel_max_s * 1000), "backchannel_max_words": t.backchannel_max_words,
              "resume_after_ms": round(t.resume_after_s * 1000)}
        if t.end_threshold is not None:
            td |= {"eagerness": next((k for k, v in eagerness_table(probe).items() if v[0] == t.end_threshold),
                                     "custom"),
                   "end_of_turn_threshold": t.end_threshold}
    return {
        "type": "realtime", "object": "realtime.session", "id": sid, "model": model, "instructions": instructions,
        "output_modalities": ["audio"], "tools": [], "tool_choice": "auto", "max_output_tokens": "inf",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": cfg.in_rate}, "transcription": {"model": "execstate"},
                      "noise_reduction": None, "turn_detection": td},
            "output": {"format": {"type": "audio/pcm", "rate": cfg.out_rate}, "voice": cfg.voice, "speed": 1.0},
        },
    }


class EventIds:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"event_{self.n}"


def events_json(ev: AgentEvent, eid: EventIds, transcripts: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The wire events of one voice agent event (``transcripts``: response id -> its transcript so far)."""
    common = {"t": round(ev.t, 6), "epoch": ev.epoch}
    if isinstance(ev, ve.AudioDelta):
        yield {"type": ev.type, "event_id": eid(), "response_id": ev.response_id, "item_id": ev.response_id,
               "output_index": 0, "content_index": 0,
               "delta": base64.b64encode(ev.samples.astype("<i2").tobytes()).decode()}
    elif isinstance(ev, ve.AudioTranscriptDelta):
        transcripts[ev.response_id] = transcripts.get(ev.response_id, "") + ev.delta
        yield {"type": ev.type, "event_id": eid(), "response_id": ev.response_id, "item_id": ev.response_id,
               "output_index": 0, "content_index": 0, "delta": ev.delta, "audio_offset": ev.offset, **common}
    elif isinstance(ev, ve.AudioResponseCreated):
        yield {"type": ev.type, "event_id": eid(), "response": {
            "id": ev.response_id, "object": "realtime.response", "status": "in_progress", "status_details": None,
            "output": [], "output_modalities": ["audio"], "metadata": {"cause": ev.cause}}, **common}
        yield {"type": "response.output_item.added", "event_id": eid(), "response_id": ev.response_id,
               "output_index": 0, "item": _item(ev.response_id, "in_progress", None)}
    elif isinstance(ev, ve.AudioResponseDone):
        transcripts.pop(ev.response_id, None)
        rid, base = ev.response_id, {"response_id": ev.response_id, "item_id": ev.response_id, "output_index": 0,
                                     "content_index": 0}
        status = "completed" if ev.status == "completed" else ev.status
        yield {"type": "response.output_audio.done", "event_id": eid(), **base}
        yield {"type": "response.output_audio_transcript.done", "event_id": eid(), **base, "transcript": ev.transcript}
        item = _item(rid, "completed" if status == "completed" else "incomplete", ev.transcript)
        yield {"type": "response.output_item.done", "event_id": eid(), "response_id": rid, "output_index": 0,
               "item": item}
        details = None if status == "completed" else {"type": status, "reason": REASONS.get(ev.reason, ev.reason)}
        yield {"type": ev.type, "event_id": eid(), "response": {
            "id": rid, "object": "realtime.response", "status": status, "status_details": details, "output": [item],
            "output_modalities": ["audio"], "audio_samples": ev.audio_samples, "usage": None}, **common}
    elif isinstance(ev, ve.SpeechStarted):
        yield {"type": ev.type, "event_id": eid(), "audio_start_ms": ev.audio_start_ms, "item_id": ev.item_id, **common}
    elif isinstance(ev, ve.SpeechStopped):
        yield {"type": ev.type, "event_id": eid(), "audio_end_ms": ev.audio_end_ms, "item_id": ev.item_id, **common}
    elif isinstance(ev, ve.InputCommitted):
        yield {"type": ev.type, "event_id": eid(), "previous_item_id": ev.previous_item_id, "item_id": ev.item_id,
               **common}
        yield {"type": "conversation.item.added", "event_id": eid(), "previous_item_id": ev.previous_item_id,
               "item": {"id": ev.item_id, "object": "realtime.item", "type": "message", "role": "user",
                        "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}}
    elif isinstance(ev, ve.ItemAdded):
        item = {"id": ev.item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                "content": [{"type": "input_text", "text": ev.text}]}
        for kind in ("conversation.item.added", "conversation.item.done"):
            yield {"type": kind, "event_id": eid(), "previous_item_id": ev.previous_item_id, "item": item, **common}
    elif isinstance(ev, ve.EndScore):
        yield {"type": ev.type, "event_id": eid(), "item_id": ev.item_id, "text": ev.text, "p_end": ev.p_end,
               "p_mass": ev.p_mass, "prefilled_tokens": ev.prefilled, **common}
    elif isinstance(ev, ve.InputCleared):
        yield {"type": ev.type, "event_id": eid(), **common}
    elif isinstance(ev, ve.InputTranscriptDelta):
        yield {"type": ev.type, "event_id": eid(), "item_id": ev.item_id, "content_index": 0, "delta": ev.delta,
               "partial": ev.partial, **common}
    elif isinstance(ev, ve.InputTranscriptCompleted):
        yield {"type": ev.type, "event_id": eid(), "item_id": ev.item_id, "content_index": 0,
               "transcript": ev.transcript, **common}
    elif isinstance(ev, ve.ItemTruncated):
        yield {"type": ev.type, "event_id": eid(), "item_id": ev.item_id, "content_index": 0,
               "audio_end_ms": ev.audio_end_ms, "transcript": ev.kept_text, **common}
    elif isinstance(ev, TurnEvent):
        yield {"type": ev.type, "event_id": eid(), "kind": ev.kind, "text": ev.text, **common}
    elif isinstance(ev, DelegationCreated):
        yield {"type": ev.type, "event_id": eid(), "delegation_id": ev.delegation_id, "call_id": ev.delegation_id,
               "tool": ev.tool, "arguments": dict(ev.arguments), "source": ev.source, "runner": "server", **common}
    elif isinstance(ev, DelegationResult):
        yield {"type": ev.type, "event_id": eid(), "delegation_id": ev.delegation_id, "status": ev.status,
               "result": ev.result, "error": ev.error, "appended": ev.appended, **common}
    elif isinstance(ev, ErrorEvent):
        kind = "server_error" if ev.code == "front_failed" else "agent_error"
        yield {**error_event(ev.code, ev.message, None, kind), **common}
    # other runtime events (none today) are not part of the audio protocol


def _item(rid: str, status: str, transcript: str | None) -> dict[str, Any]:
    content = [] if transcript is None else [{"type": "output_audio", "transcript": transcript}]
    return {"id": rid, "object": "realtime.item", "type": "message", "role": "assistant", "status": status,
            "content": content}
