"""Turn-taking on speech: voice activity and transcripts instead of word counts (pure Python).

The audio counterpart of ``turn_policy.TurnPolicy``, with the same :class:`Decision` values, fed by
an audio front (``voice/agent.py``) with what its VAD and recognizer found. Times are seconds on
the agent clock and never go back. Call order per speech segment::

    on_speech_start(t, agent_speaking) -> on_speech(t, speech_s, words, silence_s)* -> on_speech_stop(t, silence_s)
    -> on_transcript(ends_sentence)      (for segments of a user turn; ``turn_segment`` says which)

and ``on_tick(t)`` whenever time passes (``next_deadline`` says when it may decide);
``on_end_score(p)`` whenever the front model scored the turn's words so far (the probability that
the turn ends there, ``agent/prefill.py``; None: the words changed since).

Rules (:class:`SpeechTurnConfig`):

- The agent silent: speech opens (or continues) a user turn. The turn ends (``END_OF_TURN``) when
  no speech is in progress, every segment's transcript is in, and either the transcript ends a
  sentence (the recognizer's final ``.?!``: a semantic end-of-turn cue; the VAD already waited
  its ``silence_duration_ms``) or ``end_of_turn_silence_s`` passed since the last speech. A shorter
  pause does not end it. With ``end_threshold`` set (semantic turn detection), a turn whose words
  the front model scores at or above it ends once ``semantic_silence_s`` passed since the last
  speech: a finished sentence ends after a short silence, an unfinished one waits longer: the
  silence needed falls linearly from ``end_of_turn_silence_s`` (score 0, or no score yet) to
  ``semantic_silence_s`` (at the threshold), as OpenAI's semantic VAD waits less the likelier
  the model finds the end; with ``graded_wait`` off (the end-of-turn probe's scores, which are
  near 0 or 1 and were given thresholds for the short silence only) a score below the threshold
  waits ``end_of_turn_silence_s``.
  Then the score decides alone: a recognizer's final ``.?!`` is in the words the model scored
  (a recognizer that punctuates a cut-off sentence does not end the turn by itself).
- The agent speaking (generating or its audio still playing): speech opens a *burst*: ``HOLD``
  (the agent pauses) or, with ``pause_on_speech`` off, ``BACKCHANNEL`` (it keeps talking). The burst
  becomes a ``BARGE_IN`` (its segments become the user's turn) once it holds more than
  ``backchannel_max_s`` of speech or more than ``backchannel_max_words`` recognised words. A burst
  that stays short and falls silent for ``resume_after_s`` is a false interruption: ``RESUME``.
  With ``interrupt`` off, speech never interrupts the agent (bursts are backchannels).
- Backchannels never become turns: their transcripts are not the turn's.
"""

from __future__ import annotations

from dataclasses import dataclass

from execstate.agent.turn_policy import Decision

__all__ = ["Decision", "SpeechTurnConfig", "SpeechTurnPolicy"]


@dataclass(frozen=True)
class SpeechTurnConfig:
    end_of_turn_silence_s: float = 0.8
    backchannel_max_s: float = 0.8
    backchannel_max_words: int = 2
    resume_after_s: float = 0.4
    pause_on_speech: bool = True
    interrupt: bool = True
    end_threshold: float | None = None  # semantic turn detection: the end score that ends a turn early
    semantic_silence_s: float = 0.2
    graded_wait: bool = True  # below the threshold the wait falls with the score (off: the long silence)

    def __post_init__(self) -> None:
        t = self.end_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 1):
            raise ValueError(f"end_threshold must be None or a number in (0, 1], got {t!r}")
        for name in ("end_of_turn_silence_s", "backchannel_max_s", "resume_after_s", "semantic_silence_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 60:
                raise ValueError(f"{name} must be a number in (0, 60], got {v!r}")
        if not isinstance(self.graded_wait, bool):
            raise ValueError(f"graded_wait must be a bool, got {self.graded_wait!r}")
        v = self.backchannel_max_words
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
            raise ValueError(f"backchannel_max_words must be an integer in [0, 100], got {v!r}")


class SpeechTurnPolicy:
    def __init__(self, config: SpeechTurnConfig | None = None) -> None:
        self.config = config or SpeechTurnConfig()
        self.user_turn_open = False
        self.burst_open = False
        self.in_speech = False
        self.turn_segment = False  # the segment in progress belongs to the user's turn
        self.pending = 0  # turn segments whose final transcript is not in yet
        self.ends_sentence = False
        self.end_score: float | None = None  # the front model's end score of the turn's words so far
        self.last_speech_t: float | None = None
        self._burst_base = (0.0, 0)  # speech seconds and words of the burst's earlier segments
        self._seg = (0.0, 0)  # the segment in progress so far
        self._t = float("-inf")

    def on_speech_start(self, t: float, agent_speaking: bool) -> Decision:
        """NONE (a turn segment, or one more segment of an open burst), HOLD or BACKCHANNEL (a new burst)."""
        self._advance(t)
        self.in_speech, self.last_speech_t = True, t
        if self.burst_open and not self.user_turn_open:  # the burst goes on: its speech adds up
            self._burst_base = (self._burst_base[0] + self._seg[0], self._burst_base[1] + self._seg[1])
            self._seg = (0.0, 0)
            return Decision.NONE
        self._seg = (0.0, 0)
        if self.user_turn_open or not agent_speaking:
            self.user_turn_open, self.turn_segment = True, True
            self.pending += 1
            self.ends_sentence, self.end_score = False, None
            return Decision.NONE
        self.burst_open, self.turn_segment = True, False
        self._burst_base = (0.0, 0)
        return Decision.HOLD if self.config.pause_on_speech and self.config.interrupt else Decision.BACKCHANNEL

    def on_speech(self, t: float, speech_s: float, words: int, silence_s: float = 0.0) -> Decision:
        """The segment in progress so far: ``speech_s`` seconds of speech, ``words`` recognised (a
        burst counts the speech and words of all its segments), ``silence_s`` of silence since its
        last speech frame (the VAD's trailing silence so far: the speech ended ``silence_s`` ago)."""
        self._advance(t)
        if self.in_speech:
            self.last_speech_t = max(t - silence_s, self.last_speech_t or float("-inf"))
        self._seg = (speech_s, words)
        c = self.config
        total_s, total_words = self._burst_base[0] + speech_s, self._burst_base[1] + words
        if self.burst_open and not self.turn_segment and c.interrupt and (
                total_s > c.backchannel_max_s or total_words > c.backchannel_max_words):
            self.burst_open = False
            self.user_turn_open, self.turn_segment = True, True
            self.pending += 1
            self.ends_sentence, self.end_score = False, None
            return Decision.BARGE_IN
        return Decision.NONE

    def on_speech_stop(self, t: float, silence_s: float) -> None:
        """The segment ended; at ``t`` its last speech frame was ``silence_s`` ago (the VAD's
        silence, and the time since the VAD saw it: the silence counts from the speech)."""
        self._advance(t)
        self.in_speech = False
        self.last_speech_t = max(t - silence_s, self.last_speech_t or float("-inf"))

    def on_transcript(self, ends_sentence: bool) -> None:
        """The final transcript of a turn segment is in; ``ends_sentence``: the turn's text so far
        ends a sentence."""
        if self.pending > 0:
            self.pending -= 1
        self.ends_sentence = ends_sentence

    def on_end_score(self, p: float | None) -> None:
        self.end_score = p

    def _quiet_needed(self) -> float:
        """Silence that ends the open turn now: short when its words end it (punctuation: none more;
        the model's score: ``semantic_silence_s``), else ``end_of_turn_silence_s``."""
        c = self.config
        if c.end_threshold is not None:  # semantic: the score decides (the model read the punctuation too)
            short, p = min(c.semantic_silence_s, c.end_of_turn_silence_s), self.end_score
            if p is None:
                return c.end_of_turn_silence_s
            if p >= c.end_threshold:
                return short
            if not c.graded_wait:
                return c.end_of_turn_silence_s
            return c.end_of_turn_silence_s - (c.end_of_turn_silence_s - short) * p / c.end_threshold
        return 0.0 if self.ends_sentence else c.end_of_turn_silence_s

    def on_tick(self, t: float) -> Decision:
        self._advance(t)
        if self.in_speech or self.last_speech_t is None:
            return Decision.NONE
        quiet = t - self.last_speech_t
        if self.burst_open and quiet >= self.config.resume_after_s:
            self.burst_open = False
            return Decision.RESUME
        if self.user_turn_open and self.pending == 0 and quiet >= self._quiet_needed():
            self.user_turn_open = False
            self.end_score = None
            return Decision.END_OF_TURN
        return Decision.NONE

    def next_deadline(self) -> float | None:
        if self.in_speech or self.last_speech_t is None:
            return None
        if self.burst_open:
            return self.last_speech_t + self.config.resume_after_s
        if self.user_turn_open and self.pending == 0:
            return self.last_speech_t + self._quiet_needed()
        return None

    def _advance(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"time went back: {t} after {self._t}")
        self._t = t
