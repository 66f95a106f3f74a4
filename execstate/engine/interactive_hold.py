"""The hold after an interactive step: the engine keeps itself free for the next one.

An agent's front speaks a reply as a chain of short session steps, each sent by the agent a
millisecond or two after the previous one ended. Between two of them the engine would start a
step of batch work, and the front's next step, arriving a moment later, waits that whole step
out (the engine thread takes new work only between steps): with ten batch tasks on two cores, a
50-80 ms wait on top of a 70-90 ms front step (``execstate bench duplex``, ``front_time``).

So when an interactive request (class >= ``PRIORITY_INTERACTIVE``) finishes, the classes below
it get no tokens for ``hold_s`` seconds (``EngineConfig.interactive_hold_s``): a step in that
window serves only interactive requests, and one with nothing else to run is not started (the
engine waits, ``LLMEngine.step``, until a command arrives or the hold ends). The next front step
that arrives inside the hold starts at once and renews nothing: the batch budget
(``interactive_batch_budget``) governs while it runs, and its own end starts a new hold. A hold
that ends with no interactive step arrived gives the batch classes their whole steps back. The
batch work given up is at most ``hold_s`` after each interactive step, plus what the budget keeps
from it while the front runs: ``execstate bench duplex`` measures both.

State machine (``clock``: seconds, monotonic, ``time.monotonic`` by default): ``start()`` (an
interactive request finished: held until ``clock() + hold_s``), ``remaining()`` (seconds left,
0.0 when not held), ``held`` (``remaining() > 0``). ``hold_s`` 0 never holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class InteractiveHold:
    """The hold after an interactive request finishes (module docstring)."""

    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(hold_s, bool) or not isinstance(hold_s, int | float) or not 0.0 <= hold_s <= 1.0:
            raise ValueError(f"interactive hold must be a number of seconds in [0, 1], got {hold_s!r}")
        self.hold_s = float(hold_s)
        self._clock = clock
        self._until = float("-inf")
        self.num_holds = 0  # holds started (interactive requests finished with hold_s > 0)

    def start(self) -> None:
        if self.hold_s > 0.0:
            self._until = self._clock() + self.hold_s
            self.num_holds += 1

    def remaining(self) -> float:
        return max(0.0, self._until - self._clock())

    @property
    def held(self) -> bool:
        return self.remaining() > 0.0
