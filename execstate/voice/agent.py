"""``VoiceAgent``: a duplex agent that hears and speaks (the audio front over ``DuplexAgent``).

The runtime underneath is unchanged (front, fences, truncation, delegation, ledger); this class
replaces its text input and text output:

- **In**: 16 kHz PCM (any ``in_rate``, resampled) -> speech detector -> server VAD -> recognizer,
  on one worker thread per agent (``audio_input.py``). Speech segments and transcripts drive the
  speech turn policy (``agent/speech_turns.py``) in the ``Listener`` (``listener.py``), whose
  decisions reach the runtime through its external-turn calls (``hold``, ``resume``, ``barge_in``,
  ``user_turn``, ``set_floor``). Segments of
  a user turn become input items (``speech_started`` ... ``transcription.completed``); the turn
  ends on the policy's decision and its transcripts (numbers as digits, ``numbers.py``) are the
  user's turn.
- **Out**: the runtime's text responses become audio responses (``speech_out.py``): synthesised
  as the text streams, paced to the client's playback, created when they start playing and done
  after their last audio.
- **Memory**: ``close`` closes the recognizer stream (the recognizer keeps or frees its model)
  and returns the freed heap pages to the OS (``state/host_memory.py``), so connections that
  come and go leave the server's RSS where it was.
- **Interruptions**: a barge-in (or ``cancel``, or a client ``truncate`` of the playing item) stops
  all audio first (the playing response's ``response.done`` ``cancelled``), advances the epoch,
  and truncates each cut response in the runtime's context to the words that were played; only
  then is the interrupting ``speech_started`` emitted. The agent counts as speaking while a reply
  is generated *or* its audio still plays.

Events: ``events()`` yields the voice events (``voice/events.py``) and the runtime's turn,
delegation and error events, in one order. All public calls run on the event loop; the blocking
work (VAD, recognition, synthesis, resampling) runs in worker threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from execstate.agent.agent_events import AgentEvent, ErrorEvent, OutputDelta, ResponseCreated, ResponseDone
from execstate.agent.duplex import DuplexAgent
from execstate.agent.errors import AgentError
from execstate.agent.event_stream import EventStream
from execstate.agent.speech_turns import SpeechTurnConfig, SpeechTurnPolicy
from execstate.state import host_memory
from execstate.voice.audio_input import AudioInput
from execstate.voice.events import (
    InputCleared,
    InputCommitted,
    InputTranscriptCompleted,
    ItemAdded,
    ItemTruncated,
)
from execstate.voice.interfaces import Recognizer, SpeechDetector, Synthesizer
from execstate.voice.listener import Listener
from execstate.voice.numbers import words_to_digits
from execstate.voice.resample import Resampler
from execstate.voice.speech_out import SpeechOut
from execstate.voice.vad import VadConfig

RATES = (16000, 24000)


@dataclass(frozen=True)
class VoiceConfig:
    """``in_rate``/``out_rate``: the client's PCM16 rates (16 or 24 kHz); ``vad``: server VAD knobs
    (None: the client commits); ``turns``: the speech turn policy; ``create_response``: answer at
    the end of a turn (else wait for ``create_response()``); ``voice``: the synthesizer's voice;
    ``lead_ms``: how far audio is sent ahead of playback; ``chunk_ms``: audio per delta."""

    in_rate: int = 16000
    out_rate: int = 24000
    vad: VadConfig | None = field(default_factory=VadConfig)
    turns: SpeechTurnConfig = field(default_factory=SpeechTurnConfig)
    create_response: bool = True
    voice: str | None = None
    lead_ms: int = 200
    chunk_ms: int = 40
    max_buffer_s: float = 120.0
    max_events: int = 10_000

    def __post_init__(self) -> None:
        if self.in_rate not in RATES or self.out_rate not in RATES:
            raise ValueError(f"audio rates must be one of {RATES}")
        for name, lo, hi in (("lead_ms", 0, 5000), ("chunk_ms", 10, 1000)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")


class VoiceAgent:
    def __init__(self, agent: DuplexAgent, recognizer: Recognizer, synthesizer: Synthesizer,
                 detector: SpeechDetector | None, config: VoiceConfig | None = None) -> None:
        self.agent = agent
        self.config = config or VoiceConfig()
        self.recognizer, self.detector = recognizer, detector
        self.turns = SpeechTurnPolicy(self.config.turns)
        agent.prefill.draft_above = self.config.turns.end_threshold  # a turn likely over: its reply drafted
        agent.prefill.draft_while = lambda: self.turns.in_speech or self.turns.pending > 0  # while it cannot end
        self._tick_wake = asyncio.Event()
        self._in_exec = ThreadPoolExecutor(1, thread_name_prefix="voice-in")
        self._out_exec = ThreadPoolExecutor(1, thread_name_prefix="voice-out")
        self.out = SpeechOut(synthesizer, self._emit, agent.now, self._out_exec, self.config.out_rate,
                             self.config.voice, self.config.lead_ms, self.config.chunk_ms)
        self.listener = Listener(agent, self.out, self.turns, self._emit, lambda: self.config.create_response,
                                 self._tick_wake.set, self._end_context)
        self.input: AudioInput | None = None
        self._stream = EventStream(self.config.max_events, lambda: self._closed, self._set_closed)
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(self._in_exec, self.recognizer.open)
        self.input = AudioInput(self.detector, stream, self.config.vad, self.config.in_rate, self.config.max_buffer_s,
                                clock=self.agent.now)
        await self.agent.start()
        for coro, name in ((self._pump(), "voice-pump"), (self._ticker(), "voice-turns"),
                           (self.out.run(), "voice-pacer"), (self.out.synth_loop(), "voice-tts")):
            self._tasks.append(loop.create_task(coro, name=name))

    def _end_context(self) -> None:
        if self.input is not None:
            self.input.end_context()

    async def close(self, cancel_tasks: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self.out.interrupt(self.agent.fence.epoch + 1, "closed")
        self.out.close()
        await self.agent.close(cancel_tasks=cancel_tasks)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.input is not None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._in_exec, self._release_input, self.input)
        self._in_exec.shutdown(wait=False)
        self._out_exec.shutdown(wait=False)
        self._stream.end()

    @staticmethod
    def _release_input(inp: AudioInput) -> None:
        """Close the recognizer stream (its model goes back to the recognizer or is freed), then
        give the freed heap pages back to the OS: this worker thread's allocator arena would keep
        them, and a server's RSS would grow with every voice connection."""
        inp.close()
        host_memory.trim()

    async def events(self) -> AsyncIterator[AgentEvent]:
        async for ev in self._stream.events():
            yield ev

    # -- input --------------------------------------------------------------------------------------
    async def append(self, samples: np.ndarray) -> None:
        """Input audio (int16 at ``config.in_rate``), processed on the input worker."""
        self._require_open()
        assert self.input is not None
        async with self._lock:
            events = await asyncio.get_running_loop().run_in_executor(self._in_exec, self.input.process, samples)
            for ev in events:
                self.listener.on_input(ev)
        self._tick_wake.set()

    async def commit(self) -> str | None:
        """Manual turn detection: the buffered audio is one user item (its transcript), a user turn;
        None when the buffer was empty."""
        self._require_open()
        assert self.input is not None
        async with self._lock:
            final = await asyncio.get_running_loop().run_in_executor(self._in_exec, self.input.commit)
        if final is None:
            return None
        t, e = self.agent.now(), self.agent.fence.epoch
        item = self.listener.new_item()
        self._emit(InputCommitted(t, e, item, self.listener.last_item))
        text = words_to_digits(final.text)
        self._emit(InputTranscriptCompleted(self.agent.now(), e, item, text))
        self.listener.last_item = item
        if text.strip():
            self.agent.user_turn(text, respond=self.config.create_response)
        return item

    def add_text(self, text: str, item_id: str | None = None) -> str:
        """A typed user message: an input item (``conversation.item.added``) and a user turn,
        answered at ``create_response`` (OpenAI's ``conversation.item.create``)."""
        self._require_open()
        t, e = self.agent.now(), self.agent.fence.epoch
        item = item_id or self.listener.new_item()
        self._emit(ItemAdded(t, e, item, self.listener.last_item, text))
        self.listener.last_item = item
        self.agent.user_turn(text, respond=False)
        return item

    async def clear(self) -> None:
        self._require_open()
        assert self.input is not None
        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(self._in_exec, self.input.clear)
        self.listener.clear()
        self._emit(InputCleared(self.agent.now(), self.agent.fence.epoch))

    # -- output control -----------------------------------------------------------------------------
    def create_response(self) -> None:
        self._require_open()
        self.agent.respond()

    def cancel(self, cancel_tasks: bool = False) -> bool:
        """Cancel the reply in flight: generating or playing (False: neither)."""
        self._require_open()
        busy = self.agent.fence.active or self.out.audible()
        cuts = self.out.interrupt(self.agent.fence.epoch + 1, "cancel")
        self.agent.cancel(cancel_tasks=cancel_tasks, advance=True)
        self.listener.truncate_cuts(cuts)
        return busy

    def truncate(self, item_id: str, audio_end_ms: int) -> str:
        """The client played ``audio_end_ms`` of reply ``item_id``: its audio stops there (if it still
        plays, every reply's audio stops) and the runtime keeps the words played. Returns the kept
        text. AgentError ``not_found`` / ``invalid``."""
        self._require_open()
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
            raise AgentError("invalid", f"audio_end_ms must be an integer >= 0, got {audio_end_ms!r}")
        info = self.out.played_of(item_id, audio_end_ms)
        if info is None:
            raise AgentError("not_found", f"no audio item {item_id!r} (only the last 8 replies)")
        r = self.out.response(item_id)
        assert r is not None
        if audio_end_ms * self.config.out_rate // 1000 > r.sent:
            raise AgentError("invalid", f"audio_end_ms {audio_end_ms} is past the audio sent "
                             f"({r.sent * 1000 // self.config.out_rate} ms)")
        chars, playing = info
        if playing or self.agent.fence.active:
            self.out.interrupt(self.agent.fence.epoch + 1, "truncated")
            self.agent.cancel(advance=True)
        self.agent.truncate(item_id, played_chars=chars)
        kept = r.text[:chars]
        self._emit(ItemTruncated(self.agent.now(), self.agent.fence.epoch, item_id, audio_end_ms, kept))
        return kept

    async def update(self, config: VoiceConfig) -> None:
        """New settings: VAD knobs, turn policy, rates, voice, create_response (from the next frame)."""
        self._require_open()
        assert self.input is not None
        old, self.config = self.config, config
        self._stream.max_events = config.max_events
        self.turns.config = config.turns
        self.agent.prefill.draft_above = config.turns.end_threshold
        self.out.voice = config.voice
        inp = self.input

        def apply() -> None:
            if config.in_rate != old.in_rate:
                inp.resampler = Resampler(config.in_rate, 16000)
            if config.vad is not None and inp.vad is not None:
                inp.vad.config = replace(config.vad)
            elif config.vad != old.vad:
                from execstate.voice.vad import VadSegmenter
                inp.vad = VadSegmenter(config.vad) if config.vad is not None else None

        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(self._in_exec, apply)

    # -- internals ------------------------------------------------------------------------------------
    async def _ticker(self) -> None:
        while not self._closed:
            deadline = self.turns.next_deadline()
            timeout = None if deadline is None else max(deadline - self.agent.now(), 0.0) + 0.001
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick_wake.wait(), timeout)
            self._tick_wake.clear()
            if not self._closed:
                try:
                    self.listener.tick()
                except AgentError as exc:  # the runtime stopped (front failed, overflow)
                    self._emit(ErrorEvent(self.agent.now(), self.agent.fence.epoch, exc.code, exc.message))

    async def _pump(self) -> None:
        async for ev in self.agent.events():
            if isinstance(ev, ResponseCreated):
                self.out.open(ev.response_id, ev.epoch, ev.cause)
            elif isinstance(ev, OutputDelta):
                self.out.text(ev.response_id, ev.text)
            elif isinstance(ev, ResponseDone):
                if ev.status == "completed":
                    self.out.end_text(ev.response_id)
                else:
                    self.out.drop(ev.response_id, ev.reason)
            else:
                self._emit(ev)

    def _emit(self, ev: AgentEvent) -> None:
        self._stream.emit(ev)

    def _set_closed(self) -> None:
        self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise AgentError("closed", "the voice agent is closed")
