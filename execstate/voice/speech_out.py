"""The output side of a voice agent: reply text -> speech -> audio paced to the client's playback.

``SpeechOut`` keeps the audio responses in order (one plays at a time; a response the runtime
starts while the previous one still plays waits its turn). For each: the reply's text deltas are
cut into pieces (``phrases.py``), synthesised on a worker thread, resampled to ``out_rate``, and
sent as ``AudioDelta`` chunks of ``chunk_ms`` no more than ``lead_ms`` ahead of the modelled
playhead (``playback.py``), each word's text (``AudioTranscriptDelta``) with the audio where it
starts. A response is created (``AudioResponseCreated``) when it becomes the one playing and done
(``AudioResponseDone`` ``completed``) after its last audio chunk.

Fences: ``interrupt`` (a barge-in, a cancel) ends the playing response (``cancelled``, its
transcript cut to the whole words played), drops every queued one and all unsent audio, and
raises ``min_epoch``: text or responses of an older epoch that still arrive are ignored, so no
audio of an old epoch is sent after it. It returns, for each response whose audio was cut, the
characters of its text that were played (the runtime truncates its context to them).

Call order: all methods on the event loop; ``run()`` is the pacer task, ``synth_loop()`` the
synthesis task; only ``Synthesizer.synthesize`` and resampling run in ``executor``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from execstate.agent.agent_events import AgentEvent
from execstate.voice.events import AudioDelta, AudioResponseCreated, AudioResponseDone, AudioTranscriptDelta
from execstate.voice.interfaces import SynthChunk, Synthesizer
from execstate.voice.phrases import PhraseChunker
from execstate.voice.playback import PlaybackClock
from execstate.voice.resample import resample


@dataclass
class AudioResponse:
    response_id: str
    epoch: int
    cause: str
    chunker: PhraseChunker = field(default_factory=PhraseChunker)
    text: str = ""
    audio: list[np.ndarray] = field(default_factory=list)  # synthesised, unsent
    total: int = 0  # samples synthesised
    sent: int = 0
    marks: list[tuple[int, int, int]] = field(default_factory=list)  # (sample, char start, char end)
    marks_sent: int = 0
    spoken_chars: int = 0  # text sent as transcript so far
    pieces: int = 0  # pieces waiting for or in synthesis
    text_done: bool = False
    announced: bool = False
    start_pos: int | None = None  # playback timeline position of its first sample
    status: str | None = None

    def played_chars(self, played: int) -> int:
        """Characters of whole words played within ``played`` samples of this response."""
        end = 0
        for i, (_s, _c0, c1) in enumerate(self.marks):
            nxt = self.marks[i + 1][0] if i + 1 < len(self.marks) else (self.total if self.pieces == 0 else None)
            if nxt is None or nxt > played:
                break
            end = c1
        return end


class SpeechOut:
    def __init__(self, synth: Synthesizer, emit: Callable[[AgentEvent], None], now: Callable[[], float],
                 executor: Executor, out_rate: int = 24000, voice: str | None = None, lead_ms: int = 200,
                 chunk_ms: int = 40) -> None:
        self.synth, self.voice = synth, voice
        self.out_rate = out_rate
        self.lead = lead_ms * out_rate // 1000
        self.chunk = max(1, chunk_ms * out_rate // 1000)
        self.clock = PlaybackClock(out_rate)
        self.min_epoch = 0
        self._emit, self._now, self._executor = emit, now, executor
        self._queue: deque[AudioResponse] = deque()
        self._recent: OrderedDict[str, AudioResponse] = OrderedDict()  # for truncation (last 8)
        self._pieces: asyncio.Queue[tuple[AudioResponse, int, str]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self.closed = False

    # -- from the runtime's events --------------------------------------------------------------
    def open(self, response_id: str, epoch: int, cause: str) -> None:
        if epoch < self.min_epoch or self.closed:
            return
        r = AudioResponse(response_id, epoch, cause)
        self._queue.append(r)
        self._recent[response_id] = r
        while len(self._recent) > 8:
            self._recent.popitem(last=False)
        self._wake.set()

    def text(self, response_id: str, delta: str) -> None:
        r = self._live(response_id)
        if r is not None:
            r.text += delta
            self._enqueue(r, r.chunker.push(delta))

    def end_text(self, response_id: str) -> None:
        r = self._live(response_id)
        if r is not None:
            self._enqueue(r, r.chunker.end())
            r.text_done = True
            self._wake.set()

    def drop(self, response_id: str, reason: str) -> None:
        """The runtime cancelled or failed the response: what was not synthesised is not spoken;
        what was stays queued to play (its text was emitted) unless an interrupt comes."""
        r = self._live(response_id)
        if r is not None:
            r.text_done = True
            self._wake.set()

    # -- interruptions --------------------------------------------------------------------------
    def interrupt(self, epoch: int, reason: str) -> list[tuple[str, int, int]]:
        """Stop all audio (module docstring); returns (response_id, played_chars, played_ms) for
        each response whose audio was cut (queued ones: nothing played)."""
        t = self._now()
        pos = self.clock.clear(t)
        self.min_epoch = max(self.min_epoch, epoch)
        cuts = []
        for r in list(self._recent.values()):
            playing_tail = r.status == "completed" and r.start_pos is not None and r.start_pos + r.sent > pos
            if r.status is not None and not playing_tail:
                continue
            played = max(0, pos - r.start_pos) if r.start_pos is not None else 0
            cuts.append((r.response_id, r.played_chars(played) if r.start_pos is not None else 0,
                         played * 1000 // self.out_rate))
            if r.status is None and r.announced:
                self._finish(r, "cancelled", reason, t, played=played)
            elif r.status is None:
                r.status = "cancelled"  # never created on the wire
            r.audio.clear()
        self._queue.clear()
        self._wake.set()
        return cuts

    def pause(self) -> None:
        self.clock.pause(self._now())

    def resume(self) -> None:
        self.clock.resume(self._now())
        self._wake.set()

    def audible(self) -> bool:
        return bool(self._queue) or self.clock.audible(self._now())

    def played_of(self, response_id: str, audio_end_ms: int) -> tuple[int, bool] | None:
        """(played characters at ``audio_end_ms`` into the response, still playing) or None."""
        r = self._recent.get(response_id)
        if r is None:
            return None
        return r.played_chars(audio_end_ms * self.out_rate // 1000), r.status is None

    def response(self, response_id: str) -> AudioResponse | None:
        return self._recent.get(response_id)

    # -- tasks ------------------------------------------------------------------------------------
    async def synth_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed:
            r, start, text = await self._pieces.get()
            if r.status is not None or r.epoch < self.min_epoch:
                continue
            try:
                audio, marks = await loop.run_in_executor(self._executor, self._synthesize, text)
            finally:
                r.pieces -= 1
            if r.status is not None or r.epoch < self.min_epoch:
                continue
            r.marks += [(r.total + s, start + c0, start + c1) for s, c0, c1 in marks]
            r.audio.append(audio)
            r.total += len(audio)
            self._wake.set()

    async def run(self) -> None:
        while not self.closed:
            delay = self._pace()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def close(self) -> None:
        self.closed = True
        self._wake.set()
        self._pieces.put_nowait((AudioResponse("", -1, ""), 0, ""))  # unblock synth_loop

    # -- internals --------------------------------------------------------------------------------
    def _live(self, response_id: str) -> AudioResponse | None:
        r = self._recent.get(response_id)
        return r if r is not None and r.status is None and r.epoch >= self.min_epoch else None

    def _enqueue(self, r: AudioResponse, pieces: list[tuple[int, str]]) -> None:
        for start, text in pieces:
            if text.strip():
                r.pieces += 1
                self._pieces.put_nowait((r, start, text))

    def _synthesize(self, text: str) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        chunks: list[SynthChunk] = []

        def collect(c: SynthChunk) -> bool:
            chunks.append(c)
            return True  # go on

        self.synth.synthesize(text, self.voice, collect)
        audio = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.int16)
        marks = [m for c in chunks for m in c.marks]
        rate = self.synth.sample_rate
        out = resample(audio, rate, self.out_rate) if rate != self.out_rate else audio
        return out, [(m.sample * self.out_rate // rate, m.start, m.end) for m in marks]

    def _pace(self) -> float | None:
        """Send what may be sent now; returns how long until more may be (None: wait for news)."""
        while self._queue:
            r = self._queue[0]
            t = self._now()
            if not r.announced:
                r.announced = True
                self._emit(AudioResponseCreated(t, r.epoch, r.response_id, r.cause))
            if self.clock.paused:
                return None
            while r.audio and self.clock.buffered(t) < self.lead:
                self._send(r, t)
            if r.audio:
                return max(self.clock.buffered(t) - self.lead, 1) / self.out_rate
            if r.text_done and r.pieces == 0:
                self._queue.popleft()
                self._finish(r, "completed", "", t)
                continue
            return None
        return None

    def _send(self, r: AudioResponse, t: float) -> None:
        head = r.audio[0]
        n = min(self.chunk, len(head))
        chunk, rest = head[:n], head[n:]
        if len(rest):
            r.audio[0] = rest
        else:
            r.audio.pop(0)
        if r.start_pos is None:
            r.start_pos = self.clock.sent
        offset, r.sent = r.sent, r.sent + n
        while r.marks_sent < len(r.marks) and r.marks[r.marks_sent][0] < r.sent:
            _s, _c0, c1 = r.marks[r.marks_sent]
            self._emit(AudioTranscriptDelta(t, r.epoch, r.response_id, r.text[r.spoken_chars:c1], _s))
            r.spoken_chars, r.marks_sent = c1, r.marks_sent + 1
        self.clock.send(n, t)
        self._emit(AudioDelta(t, r.epoch, r.response_id, chunk, offset))

    def _finish(self, r: AudioResponse, status: str, reason: str, t: float, played: int | None = None) -> None:
        r.status = status
        if played is not None:
            transcript = r.text[:r.played_chars(played)] if r.start_pos is not None else ""
        else:
            if r.spoken_chars < len(r.text) and r.text[r.spoken_chars:].strip():
                self._emit(AudioTranscriptDelta(t, r.epoch, r.response_id, r.text[r.spoken_chars:], r.sent))
            r.spoken_chars = len(r.text)
            transcript = r.text
        self._emit(AudioResponseDone(t, r.epoch, r.response_id, status, reason, transcript, r.sent))

