"""The listening side of a voice agent: what its input events mean for the turn (``VoiceAgent``'s collaborator).

``Listener.on_input(ev)`` takes the input worker's events in order (``audio_input.py``: speech
start, progress, partials, stop, final) and ``tick()`` the passage of time; it keeps the speech
turn policy (``agent/speech_turns.py``) and acts on its decisions through public calls only:

- a user turn's segments become input items (``speech_started``, transcription deltas,
  ``speech_stopped``, ``committed``, ``transcription.completed``) and, at the policy's end of turn,
  one ``DuplexAgent.user_turn`` with their transcripts (unless nothing was heard);
- a burst over the agent: ``SpeechOut.pause`` + ``DuplexAgent.hold`` at once; a barge-in:
  ``SpeechOut.interrupt`` (the playing reply's ``response.done`` first), ``DuplexAgent.barge_in``,
  the runtime's context cut to the words played, then the interrupting ``speech_started`` (the
  burst's earlier words start the turn); a false interruption: ``SpeechOut.resume`` +
  ``DuplexAgent.resume``. The floor (``DuplexAgent.set_floor``) is the user's from speech until
  the turn or burst is over.
- the user's turn so far (its final transcripts, then the open segment's partial, without the
  final mark a recognizer may put) goes to ``DuplexAgent.user_partial`` as it changes: the agent
  prefills it and the front model scores its end (``agent/prefill.py``); a score of the turn's
  current words reaches the turn policy (``on_end_score``), whose semantic rule may then end the
  turn after a short silence.
- a recognizer that re-heard a segment together with the ones before it (``Partial.heard``,
  ``Final.heard``: from a sample on, the words of all of it) gives the turn those words in place
  of the earlier segments' own (when that audio lies inside the turn); the segment's transcript
  events keep its own words. At the end of a turn ``end_context()`` tells the recognizer the next
  segment is not a continuation.

Events are stamped with the agent's clock when they are read, except the speech's end: the
segment's last speech frame ended at its ``VadStop.speech_end_t`` (when set: what the VAD saw,
not when the stop is read, after the segment's final was transcribed); the turn's silence counts
from there (and the turn still ends only once the final's words are in).

Pure bookkeeping on the event loop: no I/O, nothing blocking.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from execstate.agent.agent_events import AgentEvent
from execstate.agent.duplex import DuplexAgent
from execstate.agent.errors import AgentError
from execstate.agent.speech_turns import Decision, SpeechTurnPolicy
from execstate.voice.audio_input import Final, InputEvent, Partial, Progress, VadStart, VadStop
from execstate.voice.events import (
    EndScore,
    InputCommitted,
    InputTranscriptCompleted,
    InputTranscriptDelta,
    SpeechStarted,
    SpeechStopped,
)
from execstate.voice.numbers import words_to_digits
from execstate.voice.speech_out import SpeechOut


@dataclass
class _Segment:
    audio_start: int
    turn: bool
    item_id: str | None = None
    partial: str = ""
    speech_s: float = 0.0
    silence_s: float = 0.0


def ends_sentence(text: str) -> bool:
    return text.rstrip()[-1:] in (".", "?", "!")


class Listener:
    def __init__(self, agent: DuplexAgent, out: SpeechOut, turns: SpeechTurnPolicy,
                 emit: Callable[[AgentEvent], None], create_response: Callable[[], bool],
                 wake: Callable[[], None] = lambda: None, end_context: Callable[[], None] = lambda: None) -> None:
        """``create_response()``: whether a finished turn is answered at once (the live setting);
        ``wake()``: the turn policy has news (a score came); ``end_context()``: a turn ended (the
        recognizer's next segment starts without the earlier ones)."""
        self.agent, self.out, self.turns = agent, out, turns
        self._emit, self._create_response, self._wake = emit, create_response, wake
        self._end_context = end_context
        self._said = ""  # the turn's words last handed to user_partial
        agent.prefill.on_score.append(self._on_score)
        self._items = itertools.count(1)
        self._seg: _Segment | None = None
        self._turn_text: list[tuple[int, str]] = []  # (segment start, words) of the turn's segments
        self._burst_texts: list[tuple[int, str]] = []  # final transcripts of the open burst's segments
        self._burst_start = 0  # where the open burst began (16 kHz samples)
        self.last_item: str | None = None

    def new_item(self) -> str:
        return f"item_in_{next(self._items)}"

    def clear(self) -> None:
        """The segment in progress was dropped (``input_audio_buffer.clear``)."""
        if self._seg is not None and self._seg.turn:
            self.turns.on_speech_stop(self.agent.now(), 0.0)
            self.turns.on_transcript(False)
        self._seg = None
        self._say(self._joined(self._turn_text))

    @staticmethod
    def with_segment(texts: list[tuple[int, str]], start: int, text: str,
                     heard: tuple[int, str] | None) -> list[tuple[int, str]]:
        """The turn's (segment start, words) with a segment's words added: its own ``text``, or,
        when the recognizer re-heard it with earlier segments of the turn (the first of them one
        the turn holds words for as they start), ``heard``'s words in place of those segments'."""
        if heard is not None and heard[0] <= start and any(s == heard[0] for s, _ in texts):
            return [*(x for x in texts if x[0] < heard[0]), (heard[0], words_to_digits(heard[1]))]
        return [*texts, (start, text)]

    def on_input(self, ev: InputEvent) -> None:
        t, e = self.agent.now(), self.agent.fence.epoch
        seg = self._seg
        if isinstance(ev, VadStart):
            speaking = self.agent.fence.active or self.out.audible()
            d = self.turns.on_speech_start(t, speaking)
            self._seg = _Segment(ev.audio_start, self.turns.turn_segment)
            self.agent.set_floor(True)
            if self._seg.turn:
                self._seg.item_id = self.new_item()
                self._emit(SpeechStarted(t, e, self._seg.item_id, _ms(ev.audio_start)))
            elif d in (Decision.HOLD, Decision.BACKCHANNEL):  # a new burst (NONE: its next segment)
                self._burst_texts, self._burst_start = [], ev.audio_start
                if d is Decision.HOLD:
                    self.out.pause()
                self.agent.hold(t, pause=d is Decision.HOLD)
        elif seg is None:
            return
        elif isinstance(ev, Progress | Partial):
            if isinstance(ev, Progress):
                seg.speech_s, seg.silence_s = ev.speech_s, ev.silence_s
            else:
                self._on_partial(seg, ev.text, t, e, ev.heard)
            if self.turns.on_speech(t, seg.speech_s, len(seg.partial.split()), seg.silence_s) is Decision.BARGE_IN:
                self._barge_in(seg, t)
        elif isinstance(ev, VadStop):  # the silence since the last speech frame, not since the final came
            end_t = ev.speech_end_t
            silence = (ev.audio_end - ev.speech_end) / 16000 if end_t is None else max(t - end_t, 0.0)
            self.turns.on_speech_stop(t, silence)
            if seg.turn:
                assert seg.item_id is not None
                self._emit(SpeechStopped(t, e, seg.item_id, _ms(ev.audio_end)))
                self._emit(InputCommitted(t, e, seg.item_id, self.last_item))
                self.last_item = seg.item_id
        elif isinstance(ev, Final):
            text = words_to_digits(ev.text)
            if seg.turn:
                assert seg.item_id is not None
                self._emit(InputTranscriptCompleted(t, e, seg.item_id, text))
                self._turn_text = self.with_segment(self._turn_text, seg.audio_start, text, ev.heard)
                self.turns.on_transcript(ends_sentence(" ".join(x for _, x in self._turn_text)))
                self._say(self._joined(self._turn_text))
            else:
                self._burst_texts.append((seg.audio_start, text))
            self._seg = None

    def _on_partial(self, seg: _Segment, text: str, t: float, e: int, heard: tuple[int, str] | None) -> None:
        old, seg.partial = seg.partial, text
        if seg.turn and seg.item_id is not None:
            delta = text[len(old):] if text.startswith(old) else ""
            self._emit(InputTranscriptDelta(t, e, seg.item_id, delta, text))
            self._say(self._joined(self.with_segment(self._turn_text, seg.audio_start, words_to_digits(text), heard)))

    @staticmethod
    def _joined(texts: list[tuple[int, str]]) -> str:
        """The turn's words as the agent gets them: without the recognizer's final mark (a
        recognizer that punctuates marks a cut-off phrase as a sentence too: "Tell me along."
        in a pause; the front model judges from the words whether they end the turn)."""
        return " ".join(x for _, x in texts if x.strip()).rstrip(" .?!,;:")

    def _say(self, text: str) -> None:
        """The turn's words so far, to the agent (prefill and end score) when they changed."""
        if text != self._said:
            self._said = text
            self.turns.on_end_score(None)
            self.agent.user_partial(text)
        elif (score := self.agent.prefill.score) is not None and score[0] == text:
            self.turns.on_end_score(score[1])  # the same words, scored already (a segment with no new words)

    def _on_score(self, text: str, p: float) -> None:
        if text == self._said and self.turns.user_turn_open:
            self.turns.on_end_score(p)
            item = self._seg.item_id if self._seg is not None else self.last_item
            mass = self.agent.prefill.mass
            self._emit(EndScore(self.agent.now(), self.agent.fence.epoch, item, text, round(p, 4),
                                self.agent.prefill.stats.computed, None if mass is None else round(mass, 4)))
            self._wake()

    def _barge_in(self, seg: _Segment, t: float) -> None:
        """The open burst took the floor: its earlier segments' words and this segment are the turn."""
        cuts = self.out.interrupt(self.agent.fence.epoch + 1, "barge_in")  # the playing reply's done first
        heard = " ".join(x for x in [*(w for _, w in self._burst_texts), seg.partial] if x)
        self.agent.barge_in(t, heard)
        self.truncate_cuts(cuts)
        self._turn_text, self._burst_texts = [x for x in self._burst_texts if x[1]], []
        seg.turn, seg.item_id = True, self.new_item()
        self._emit(SpeechStarted(t, self.agent.fence.epoch, seg.item_id, _ms(self._burst_start)))
        if heard:
            self._emit(InputTranscriptDelta(t, self.agent.fence.epoch, seg.item_id, heard, heard))

    def truncate_cuts(self, cuts: list[tuple[str, int, int]]) -> None:
        for response_id, chars, _ms in cuts:
            with contextlib.suppress(AgentError):  # forgotten or never created in the runtime: nothing to cut
                self.agent.truncate(response_id, played_chars=chars)

    def tick(self) -> None:
        t = self.agent.now()
        d = self.turns.on_tick(t)
        if d is Decision.END_OF_TURN:
            text = self._joined(self._turn_text)
            self._turn_text, self._said = [], ""
            self._end_context()
            self.agent.set_floor(self.turns.burst_open)
            if text:
                self.agent.user_turn(text, t, respond=self._create_response())
        elif d is Decision.RESUME:
            self.agent.set_floor(self.turns.user_turn_open)
            self.out.resume()
            self.agent.resume(t, " ".join(x for _, x in self._burst_texts if x))
            self._burst_texts = []



def _ms(samples16k: int) -> int:
    return samples16k // 16
