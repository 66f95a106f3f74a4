"""The client's playback of the agent's audio, as the server models it (pure Python, no clock).

Audio is sent ahead of playback; the client plays what it received in order, at the sample rate,
from the moment it arrives. ``PlaybackClock`` tracks, for a timeline of sent samples (all audio
responses in a row), where the playhead is at time ``t``:

- ``send(n, t)``: ``n`` more samples arrived at ``t``. If the playhead had caught up with the
  audio (an underrun, or nothing sent yet), playback restarts at ``t``.
- ``pause(t)`` / ``resume(t)``: the client paused (a hold: the user may be interrupting) and
  resumed (a false interruption); the playhead does not move while paused.
- ``clear(t)``: unplayed audio is dropped (an interruption): ``sent`` becomes the playhead, and a
  pause ends (the client flushed its buffer).
- ``position(t)`` is the playhead (samples), ``buffered(t)`` what was sent and not yet played,
  ``audible(t)`` whether audio is still to be heard (buffered, or paused mid-audio).

``t`` never goes back (ValueError). A client that reports its real position
(``conversation.item.truncate``) overrides this estimate for truncation.
"""

from __future__ import annotations


class PlaybackClock:
    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.sent = 0
        self.paused = False
        self._pos = 0.0  # playhead at _t
        self._t = float("-inf")
        self._playing = False  # the playhead moves (not paused, not caught up)

    def position(self, t: float) -> int:
        return int(self._advance(t) + 1e-6)

    def buffered(self, t: float) -> int:
        return self.sent - self.position(t)

    def audible(self, t: float) -> bool:
        return self.buffered(t) > 0

    def send(self, n: int, t: float) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        self._advance(t)
        self.sent += n
        if not self.paused and n > 0:
            self._playing = True

    def pause(self, t: float) -> None:
        self._advance(t)
        self.paused, self._playing = True, False

    def resume(self, t: float) -> None:
        self._advance(t)
        self.paused = False
        self._playing = self._pos < self.sent

    def clear(self, t: float) -> int:
        """Drop the unplayed audio; returns the playhead."""
        pos = int(self._advance(t) + 1e-6)
        self._pos = float(pos)
        self.sent = pos
        self._playing = self.paused = False
        return pos

    def _advance(self, t: float) -> float:
        if t < self._t:
            raise ValueError(f"time went back: {t} after {self._t}")
        if self._playing and self._t != float("-inf"):
            self._pos = min(float(self.sent), self._pos + (t - self._t) * self.rate)
            if self._pos >= self.sent:
                self._playing = False
        self._t = t
        return self._pos
