"""How many threads the CPU kernels use, chosen step by step: the whole team or one thread.

Why: the kernels split each call over an OpenMP team (torch's threads) that meets at barriers; a
whole-layer decode call forks once and crosses 4-5 barriers. On a shared host a thread is often
descheduled, and every barrier then waits for it while its partner spins on the time slice the
other needs. At a load of 4 on 2 cores a 2-thread smollm2-135m decode step took 627 ms against
45 ms on one thread (560 ms of it in barriers, fork and join). One thread has no partner to wait
for; on an idle machine the team is faster. Neither is right all the time.

``TeamGovernor`` measures instead of guessing. Per whole-layer call it knows the last seconds of
the same layer at the same token count in each mode (``team``: every thread; ``solo``: one) and:

- runs in the mode it holds to be faster, and every so often **probes** the other for
  ``probe_calls`` layer calls; the other mode wins when it is ``gain`` times faster. A probe
  that loses doubles the interval to the next (``min_interval`` .. ``max_interval`` calls), so
  a costly mode is tried ever more rarely; a switch resets it. A probe stops at its first call
  that is ``fallback`` times slower than the held mode. A probe of the team from solo first
  runs one team call that it does not measure: the other threads slept through the solo
  stretch, and that call pays their wake-up (measured on the 2-vCPU VM: a 16 us call took 49 us
  after 10 ms of solo work), which could make a probe lose on a machine where the team is the
  faster mode and leave the engine on one thread for the rest of a run;
- in team mode, a call that takes ``fallback`` times the solo estimate of that layer switches
  to solo at once: a descheduled partner shows in the very call it stalls.

The mode holds for the whole step (``step()``): every kernel and torch op on the engine thread,
the MoE experts and the LM head included, runs with its team size; ``step()`` restores the
configured size afterwards. Only a step of at most ``MAX_LINEAR_ROWS`` tokens (``step(busy,
tokens)``) takes the mode held for the whole-layer calls, which only such steps make. A larger
step (a prefill, a long chunk) takes the per-op path, whose calls are long (tens of ms in a
2,048-token step); its mode is held by a second governor, ``large``, by the same rules with each
such step as one call (its wall time per token, keyed by the token count's power of two; probes
one step long, every 8 to 256 large steps), but for one: on the team it probes solo only after a
team step ran ``fallback`` times slower per token than the best team step of its size
(``probe_solo_when_slow``). A probe there is a whole prefill on one thread (0.8 s more for an
8 x 256-token fp32 prefill of smollm2-135m, half again its time), and on a quiet machine one
every 8 to 256 prefills showed as an outlier in every bench of a few dozen. (Holding the decode
calls' mode there cost a prefill half its speed: batch-1 decode, where one thread is about as
fast as two, often leaves the governor solo on a quiet machine, and an 8 x 256-token prefill of
the standard MoE then took 608 ms on one thread against 375 ms on two; under load, a partner
descheduled at the prefill's barriers still sends ``large`` solo.)
``step(busy)``: while ``busy()`` is true (work of the step's own on another thread, e.g. a
grammar's token masks computed beside the forward pass) the layer calls leave it a thread (the
team less one; not measured), instead of a team thread being descheduled for it at every
barrier. Results never depend on the choice: every kernel computes each
output the same way whatever the thread count (bit for bit, tested in tests/kernels).

Call order (engine thread): ``with governor.step(busy, tokens):`` then, around each whole-layer call,
``threads = governor.before_call(key)`` and ``governor.after_call(key, seconds)``. Not
reentrant; one governor per engine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from execstate.kernels.ext import lib, max_threads
from execstate.kernels.gemm import MAX_LINEAR_ROWS


class TeamGovernor:
    """Chooses team or solo per layer call (module docstring). ``set_threads(n)`` sets the calling
    thread's team size, ``get_threads()`` reads the configured one at the start of a step."""

    def __init__(self, set_threads: Callable[[int], None], get_threads: Callable[[], int], *,
                 min_interval: int = 32, max_interval: int = 4096, probe_calls: int = 2, gain: float = 1.1,
                 fallback: float = 1.5, large_steps: bool = True, probe_solo_when_slow: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not (1 <= min_interval <= max_interval and probe_calls >= 1 and gain >= 1.0 and fallback > 1.0):
            raise ValueError("TeamGovernor: need 1 <= min_interval <= max_interval, probe_calls >= 1, gain >= 1, "
                             "fallback > 1")
        self._set, self._get = set_threads, get_threads
        self._clock = clock  # the large steps' wall time
        self.min_interval, self.max_interval = min_interval, max_interval
        self.probe_calls, self.gain, self.fallback = probe_calls, gain, fallback
        self.solo = False  # the held mode
        self.switches = 0  # mode changes so far (probes won, fallbacks)
        self.probes = 0
        self.calls = 0  # layer calls so far, and those of them run on one thread (for reports)
        self.solo_calls = 0
        self._est: dict[tuple[bool, Hashable], float] = {}
        self._interval = min_interval
        self._until_probe = min_interval
        self._probe_left = 0
        self._ratios: list[float] = []
        self._full = 1
        self._applied = 0
        self._call_solo = False
        self._warmup = False  # the next call is a team probe's unmeasured first call
        # on the team, probe solo only once a team call ran `fallback` times its key's best (module docstring)
        self.probe_solo_when_slow = probe_solo_when_slow
        self._best_team: dict[Hashable, float] = {}
        self._slowed = False
        self._in_step = False
        self._busy: Callable[[], bool] | None = None
        self._lent = False
        # the mode of steps above MAX_LINEAR_ROWS tokens, measured per step (module docstring)
        self.large = (TeamGovernor(set_threads, get_threads, min_interval=8, max_interval=256, probe_calls=1,
                                   gain=gain, fallback=fallback, large_steps=False, probe_solo_when_slow=True)
                      if large_steps else None)

    @property
    def threads(self) -> int:
        """The team size the held mode gives this step (1 outside a step's multi-thread team)."""
        return 1 if self.solo else self._full

    @contextmanager
    def step(self, busy: Callable[[], bool] | None = None, tokens: int = 1) -> Iterator[None]:
        """One engine step of ``tokens`` tokens: in the held mode when ``tokens <= MAX_LINEAR_ROWS``,
        else in the mode ``large`` holds for such steps (module docstring); the configured team size
        is restored on exit. ``busy``: while it returns True the layer calls run on one thread fewer
        (module docstring)."""
        if self._in_step:
            raise RuntimeError("TeamGovernor.step is not reentrant")
        if tokens > MAX_LINEAR_ROWS and self.large is not None:
            self._in_step = True
            try:
                with self.large.step():
                    key = tokens.bit_length()  # steps of similar size compare, per token
                    self.large.before_call(key)
                    t0 = self._clock()
                    yield
                    self.large.after_call(key, (self._clock() - t0) / tokens)
            finally:
                self._in_step = False
            return
        self._full = self._get()
        self._busy = busy
        self._in_step = True
        self._applied = self._full
        self._apply(self.threads)
        try:
            yield
        finally:
            self._in_step = False
            self._busy = None
            self._apply(self._full)

    def before_call(self, key: Hashable) -> int:
        """The team size of the next layer call (``key``: the layer and its token count)."""
        if self._full == 1:
            return 1
        self._lent = self._busy is not None and self._busy()
        if self._lent:  # a thread lent to the step's other work: not a measurement
            n = max(1, self.threads - 1)
            self._apply(n)
            self._count(n)
            return n
        due = not self._probe_left and self._until_probe <= 0
        if due and self.probe_solo_when_slow and not self.solo and not self._slowed:
            due = False  # the team runs as fast as it has: no solo probe (module docstring)
        if due:
            self._slowed = False
            self._probe_left, self._ratios = self.probe_calls, []
            self._warmup = self.solo  # probing the team: its first call wakes the idle threads
            self.probes += 1
        self._call_solo = self.solo != bool(self._probe_left)
        n = 1 if self._call_solo else self._full
        self._apply(n)
        self._count(n)
        return n

    def _count(self, n: int) -> None:
        self.calls += 1
        self.solo_calls += n == 1

    def after_call(self, key: Hashable, seconds: float) -> None:
        """Record the call's wall time; may switch the held mode."""
        if self._full == 1 or self._lent:
            self._apply(self.threads)
            return
        if self._warmup:  # the team's wake-up (module docstring): not a measurement
            self._warmup = False
            self._apply(self.threads)
            return
        mode = self._call_solo
        held = self._est.get((self.solo, key))
        self._est[(mode, key)] = seconds
        if not mode:
            best = self._best_team.get(key)
            if best is None or seconds < best:
                self._best_team[key] = seconds
            elif seconds > self.fallback * best:
                self._slowed = True
        if self._probe_left:
            self._probe_left -= 1
            if held is not None:
                self._ratios.append(seconds / held)
            if held is not None and seconds > self.fallback * held:
                self._probe_left = 0  # clearly worse: stop now
            if not self._probe_left:
                self._end_probe()
        else:
            self._until_probe -= 1
            solo_est = self._est.get((True, key))
            if not self.solo and solo_est is not None and seconds > self.fallback * solo_est:
                self._switch()
        self._apply(self.threads)

    def _end_probe(self) -> None:
        if self._ratios and statistics.median(self._ratios) * self.gain < 1.0:
            self._switch()
            return
        self._interval = min(2 * self._interval, self.max_interval)
        self._until_probe = self._interval

    def _switch(self) -> None:
        self.solo = not self.solo
        self.switches += 1
        self._interval = self._until_probe = self.min_interval

    def _apply(self, n: int) -> None:
        if n != self._applied:
            self._set(n)
            self._applied = n


def team_governor(policy: str, kernels: bool) -> TeamGovernor | None:
    """The engine's governor for ``EngineConfig.kernel_team`` (``"adaptive"``: one; ``"full"``, or a
    model off the CPU kernels: None, the configured team always)."""
    if policy == "full" or not kernels:
        return None
    if policy != "adaptive":
        raise ValueError(f"kernel_team must be 'adaptive' or 'full', got {policy!r}")
    return TeamGovernor(lib().set_threads, max_threads)


__all__ = ["TeamGovernor", "team_governor"]
