"""``DuplexAgent``: a front that listens while it speaks, delegates to a back end, survives barge-in.

One asyncio task (the *loop*) drives the front step by step (``config.step_tokens`` tokens per
step); the public calls (``feed``, ``cancel``, ``truncate``, ``deliver_result``) run on the same
event loop, take effect at once in the agent's state and reach the front's context at the next
step boundary. Order of one loop turn::

    tick the turn policy (end of turn, resume) -> boundary: rollbacks for truncations, results
    appended (or marked stale), the next response started -> one front step, or wait for input,
    a result or the policy's next deadline

Guarantees (``agent/fence.py``): a barge-in or cancel advances the epoch and ends the response in
flight (``response.done`` ``cancelled``) in the same call, then cancels the front's step; deltas the
step still produces are dropped, so no old-epoch output follows the terminal event, and every
response has exactly one terminal event. After an interruption the response's item is truncated
to what was emitted; ``truncate`` cuts it further to what was played. A delegation belongs to the
epoch it was created in; its result is appended (and spoken) only if the epoch is still current at
the boundary that would append it, else it is ``stale``. Interruptions leave back-end tasks running
unless ``cancel(cancel_tasks=True)`` or ``config.cancel_tasks_on_barge_in``.

A front that fails (a step raises, e.g. its context reached ``max_model_len``) fails the response
in flight (``response.done`` ``failed``), emits ``error`` ``front_failed`` and stops the agent;
``close`` still releases everything.

Input: ``feed(text, t)``, a chunk of words with its time on the agent's clock (seconds since
``start``; None: now). Backchannels and false interruptions never enter the context. User turns
enter it at the boundary of the response that answers them (``user_prefix`` + text). Events:
``agent/agent_events.py``; a consumer that stops reading lets at most ``max_events`` pile up,
then the agent closes itself with an ``error`` event ``overflow``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from execstate.agent.agent_events import (
    AgentEvent,
    DelegationId,
    ErrorEvent,
    ResponseId,
    TurnEvent,
)
from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, ToolCallParser
from execstate.agent.fence import ResponseFence
from execstate.agent.front import FrontModel
from execstate.agent.front_loop import _END, AgentError, AgentStats, FrontLoop, _Plan
from execstate.agent.ledger import ToolLedger
from execstate.agent.transcript import Transcript
from execstate.agent.turn_policy import Decision, TurnPolicy


class DuplexAgent(FrontLoop):
    def __init__(self, front: FrontModel, backend: Backend | None = None, policy: RegexPolicy | None = None,
                 config: AgentConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.front = front
        self.backend = backend or Backend()
        self.policy = policy
        self.config = config or AgentConfig()
        self.turns = TurnPolicy(self.config.turn)
        self.fence = ResponseFence(self._emit)
        self.ledger = ToolLedger()
        self.transcript = Transcript()
        self.stats = AgentStats()
        self._clock = clock
        self._t0 = clock()
        self._last_t = 0.0
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._turn: list[str] = []  # the open user turn
        self._burst: list[str] = []  # input while the agent speaks, not (yet) a turn
        self._pending: list[tuple[str, list[int]]] = [("prefix", front.prelude())]
        self._replay: list[int] = []  # recorded in the transcript, to send after a rewind
        self._replay_from = 0  # segments the front holds while a replay is unsent
        self._plans: deque[_Plan] = deque()
        self._first: _Plan | None = None  # the plan of the response whose first step is next
        self._ready: deque[DelegationId] = deque()
        self._truncs: list[tuple[str, int]] = []
        self._kept: dict[str, int] = {}  # tokens each truncated response keeps
        self._parser: ToolCallParser | None = None
        self._generated = 0
        self._paused = False
        self._stepping = False
        self._closed = False  # no more input; the loop stops
        self._shut = False  # close() ran
        self._task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[None]] = set()  # cancels sent to the front

    # -- public API ---------------------------------------------------------------------------------
    def now(self) -> float:
        return max(self._clock() - self._t0, self._last_t)

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="duplex-agent")

    def feed(self, text: str, t: float | None = None) -> None:
        """A chunk of user input at time ``t`` (module docstring); AgentError ``invalid``/``closed``."""
        self._require_open()
        if not isinstance(text, str) or not text.strip() or len(text) > self.config.max_input_chars:
            raise AgentError("invalid", f"input must be a non-empty string of at most {self.config.max_input_chars} "
                             "characters")
        t = self._at(t)
        d = self.turns.on_input(len(text.split()), t, self.fence.active, text.rstrip()[-1] in ".?!")
        if d is Decision.NONE:
            self._turn.append(text)
        elif d in (Decision.HOLD, Decision.BACKCHANNEL):
            self._burst.append(text)
            self._paused = d is Decision.HOLD
            self._emit(TurnEvent(t, self.fence.epoch, d.value, text))
        elif d is Decision.BARGE_IN:
            self._turn, self._burst = [*self._burst, text], []
            self._interrupt(t, "barge_in", self.config.cancel_tasks_on_barge_in)
            self._emit(TurnEvent(t, self.fence.epoch, d.value, " ".join(self._turn)))
        self._wake.set()

    def cancel(self, cancel_tasks: bool = False) -> bool:
        """Cancel the response in flight (False if none); ``cancel_tasks`` also cancels open back-end tasks."""
        self._require_open()
        active = self.fence.active
        self._interrupt(self.now(), "cancel", cancel_tasks)
        self._wake.set()
        return active

    def cancel_delegation(self, delegation_id: str) -> bool:
        """Cancel one back-end task (ledger: cancelled; its result, if it still comes, is ``late``)."""
        d = self.ledger.get(delegation_id)
        if not self.ledger.cancel(d.delegation_id):
            return False
        self.backend.cancel(d.delegation_id)
        return True

    def truncate(self, item_id: str, played_chars: int | None = None, played_ms: float | None = None) -> int:
        """Cut a finished response's item to what was played (applied at the next boundary);
        returns the tokens it keeps (a truncation only ever shortens). AgentError ``not_found`` /
        ``invalid``."""
        self._require_open()
        r = self.fence.responses.get(ResponseId(item_id))
        if r is None or not self.transcript.has_mark(item_id):
            raise AgentError("not_found", f"no truncatable item {item_id!r} (only the last "
                             f"{self.transcript.max_marks} responses can be truncated)")
        if r.status is None:
            raise AgentError("invalid", f"item {item_id!r} is still being generated; cancel it first")
        if (played_chars is None) == (played_ms is None):
            raise AgentError("invalid", "give exactly one of played_chars and played_ms")
        pos = played_chars if played_chars is not None else played_ms
        if isinstance(pos, bool) or not isinstance(pos, int | float) or not pos >= 0 or (
                played_chars is not None and not isinstance(pos, int)):
            raise AgentError("invalid", f"the playback position must be a number >= 0 (characters: an integer), "
                             f"got {pos!r}")
        chars = played_chars if played_chars is not None else int(pos * self.config.chars_per_s / 1000)
        keep = min(r.tokens_within(chars), self._kept.get(r.response_id, len(r.token_ids)))  # only ever shortens
        self._kept[r.response_id] = keep
        for k in [k for k in self._kept if k not in self.fence.responses]:
            del self._kept[k]
        self._truncs.append((item_id, keep))
        self._wake.set()
        return keep

    def deliver_result(self, delegation_id: str, result: str) -> None:
        """A result for a delegation (e.g. a tool the client runs); LedgerError on late/duplicate/unknown."""
        self._require_open()
        self._settle(self.ledger.resolve(delegation_id, str(result), self.fence.epoch, self.now()))

    async def events(self) -> AsyncIterator[AgentEvent]:
        """Every event, in order, until the agent is closed."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            assert isinstance(item, AgentEvent)
            yield item

    async def close(self, cancel_tasks: bool = True) -> None:
        """Stop: the response in flight is cancelled, the front released, back-end tasks cancelled
        (or, ``cancel_tasks=False``, awaited). Idempotent."""
        if self._shut:
            return
        self._shut = True
        self._interrupt(self.now(), "closed", False)
        self._closed = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        await self.backend.close(cancel=cancel_tasks)
        await self.front.close()
        self._queue.put_nowait(_END)

    # -- helpers ------------------------------------------------------------------------------------------
    def _emit(self, ev: AgentEvent) -> None:
        if self._queue.qsize() >= self.config.max_events:
            if not self._closed:
                self._closed = True
                self._queue.put_nowait(ErrorEvent(ev.t, ev.epoch, "overflow", "events were not consumed"))
            return
        self._queue.put_nowait(ev)

    def _at(self, t: float | None) -> float:
        if t is None:
            t = self.now()
        elif isinstance(t, bool) or not isinstance(t, int | float) or t < self._last_t:
            raise AgentError("invalid", f"t must be a number >= the last input time {self._last_t}, got {t!r}")
        self._last_t = float(t)
        return float(t)

    def _require_open(self) -> None:
        if self._closed:
            raise AgentError("closed", "the agent is closed")
