"""Turn-taking on a timed input stream (pure Python, no model, no clock of its own).

The caller feeds input chunks (``on_input(n_words, t, agent_speaking)``) and the passage of time
(``on_tick(t, agent_speaking)``); each returns a :class:`Decision`. ``t`` never goes back.

Rules (:class:`TurnConfig`):

- The agent silent: input opens (or continues) a user turn; the turn ends (``END_OF_TURN``) once
  ``end_of_turn_silence_s`` passed since its last chunk. A shorter pause does not end it. When
  the last chunk looks final (``final``: the caller's cue, e.g. it ends a sentence; a text-time
  stand-in for a semantic end-of-turn detector) the silence needed is ``final_silence_s``
  instead (None: no shortcut).
- The agent speaking: input opens a *burst*. While the burst holds at most
  ``backchannel_max_words`` words it does not interrupt: ``HOLD`` (the agent pauses its output,
  when ``pause_on_speech``) or ``BACKCHANNEL`` (it keeps talking). The chunk that takes the burst
  above that count is a ``BARGE_IN``: the burst becomes the user's turn (the agent stops).
  A burst that stays short and falls silent for ``resume_after_s`` is a false interruption:
  ``RESUME`` (the agent continues the same response).
- ``agent_speaking`` is the caller's truth at each call; a burst or turn in progress keeps its
  meaning whatever the later flag says.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Decision(enum.Enum):
    NONE = "none"
    END_OF_TURN = "end_of_turn"
    HOLD = "hold"
    BACKCHANNEL = "backchannel"
    BARGE_IN = "barge_in"
    RESUME = "resume"


@dataclass(frozen=True)
class TurnConfig:
    end_of_turn_silence_s: float = 0.8
    backchannel_max_words: int = 2
    resume_after_s: float = 0.6
    pause_on_speech: bool = True
    final_silence_s: float | None = 0.15

    def __post_init__(self) -> None:
        if not self.end_of_turn_silence_s > 0 or not self.resume_after_s > 0:
            raise ValueError("end_of_turn_silence_s and resume_after_s must be > 0")
        if self.final_silence_s is not None and not self.final_silence_s > 0:
            raise ValueError("final_silence_s must be > 0 or None")
        if isinstance(self.backchannel_max_words, bool) or not isinstance(self.backchannel_max_words, int) \
                or self.backchannel_max_words < 0:
            raise ValueError("backchannel_max_words must be an integer >= 0")


class TurnPolicy:
    def __init__(self, config: TurnConfig | None = None) -> None:
        self.config = config or TurnConfig()
        self.turn_words = 0  # words of the user turn in progress (0: none)
        self.burst_words = 0  # words of the burst in progress while the agent speaks (0: none)
        self.last_input_t: float | None = None
        self.last_final = False  # the turn's last chunk looked final
        self._t = float("-inf")

    @property
    def user_turn_open(self) -> bool:
        return self.turn_words > 0

    @property
    def burst_open(self) -> bool:
        return self.burst_words > 0

    def on_input(self, n_words: int, t: float, agent_speaking: bool, final: bool = False) -> Decision:
        self._advance(t)
        if n_words <= 0:
            return Decision.NONE
        self.last_input_t = t
        self.last_final = final
        if self.turn_words or not agent_speaking:
            self.turn_words += n_words
            return Decision.NONE
        self.burst_words += n_words
        if self.burst_words > self.config.backchannel_max_words:
            self.turn_words, self.burst_words = self.burst_words, 0
            return Decision.BARGE_IN
        return Decision.HOLD if self.config.pause_on_speech else Decision.BACKCHANNEL

    def on_tick(self, t: float) -> Decision:
        self._advance(t)
        if self.last_input_t is None:
            return Decision.NONE
        quiet = t - self.last_input_t
        if self.burst_words and quiet >= self.config.resume_after_s:
            self.burst_words = 0
            return Decision.RESUME
        if self.turn_words and quiet >= self._silence():
            self.turn_words = 0
            return Decision.END_OF_TURN
        return Decision.NONE

    def next_deadline(self) -> float | None:
        """When ``on_tick`` may next decide something (None: not before more input)."""
        if self.last_input_t is None:
            return None
        if self.burst_words:
            return self.last_input_t + self.config.resume_after_s
        if self.turn_words:
            return self.last_input_t + self._silence()
        return None

    def _silence(self) -> float:
        fs = self.config.final_silence_s
        long = self.config.end_of_turn_silence_s
        return min(fs, long) if self.last_final and fs is not None else long

    def _advance(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"time went back: {t} after {self._t}")
        self._t = t
