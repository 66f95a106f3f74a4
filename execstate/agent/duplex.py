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

While the user speaks (an audio front's partial transcripts, ``user_partial``), the idle loop
prefills their turn speculatively and scores its end (``agent/prefill.py``; with the end-of-turn
probe on the front's hidden state when ``AgentConfig.end_score`` and the front's model allow it,
``agent/end_probe.select``); a reply's first step
keeps what the speculation holds of its input (the front truncated to their longest common prefix)
and sends the rest; with nothing in common the front is rolled back first (as before anything
else touches it). A turn scored likely over (``prefill.draft_above``) has its reply's first step
drafted while the silence runs; the reply speaks the draft only if its input is exactly the one
drafted on, else the drafted tokens are truncated away unspoken.

Input: ``feed(text, t)``, a chunk of words with its time on the agent's clock (seconds since
``start``; None: now), at most ``max_input_chars``; the input not yet taken (the open turn and any
held burst) is at most ``max_turn_chars``, so the delegation policy's match is bounded too. Backchannels and false
interruptions never enter the context. User turns
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
from dataclasses import dataclass

from execstate.agent import end_probe
from execstate.agent.agent_events import AgentEvent, DelegationResult, ErrorEvent, ResponseId, TurnEvent
from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy
from execstate.agent.delegations import Delegations
from execstate.agent.errors import AgentError, AgentStats, Interrupt
from execstate.agent.event_stream import EventStream
from execstate.agent.fence import Response, ResponseFence
from execstate.agent.front import FrontChunk, FrontModel
from execstate.agent.front_context import FrontContext
from execstate.agent.ledger import ToolLedger
from execstate.agent.prefill import SpeculativePrefill
from execstate.agent.transcript import Transcript
from execstate.agent.turn_policy import Decision, TurnPolicy
from execstate.tool_calls.parser import ToolCallStream
from execstate.tool_calls.parsers import tool_parser

__all__ = ["AgentConfig", "AgentError", "AgentStats", "DuplexAgent"]



@dataclass
class _Plan:
    """A response to start: why (``turn`` | ``result``) and what it says first ("": the model speaks)."""

    cause: str
    forced: str


class DuplexAgent:
    def __init__(self, front: FrontModel, backend: Backend | None = None, policy: RegexPolicy | None = None,
                 config: AgentConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.front = front
        self.policy = policy
        self.config = config or AgentConfig()
        self.turns = TurnPolicy(self.config.turn)
        self.fence = ResponseFence(self._emit)
        self.context = FrontContext(front)
        ends = [front.encode(x)[:1] for x in (self.config.agent_prefix, ".", "?", "!")]
        probe = end_probe.select(self.config.end_score, front.weights_version)
        self.prefill = SpeculativePrefill(front, frozenset(t for e in ends for t in e)
                                          if self.config.speculative_prefill else frozenset(), probe)
        self.delegations = Delegations(backend or Backend(), self._emit, self.now, lambda: self.fence.epoch,
                                       self._wake_up, lambda: not self._closed)
        self.stats = AgentStats()
        self._clock = clock
        self._t0 = clock()
        self._last_t = 0.0
        self._stream = EventStream(self.config.max_events, lambda: self._closed, self._set_closed)
        self._wake = asyncio.Event()
        self._turn: list[str] = []  # the open user turn
        self._burst: list[str] = []  # input while the agent speaks, not (yet) a turn
        self._held_chars = 0  # characters in _turn and _burst (bounded by config.max_turn_chars)
        self._plans: deque[_Plan] = deque()
        self._first: _Plan | None = None  # the plan of the response whose first step is next
        self._parser: ToolCallStream | None = None
        self._generated = 0
        self._paused = False
        self._user_floor = False  # set_floor: an audio front's user is speaking
        self._stepping = False
        self._closed = False  # no more input; the loop stops
        self._shut = False  # close() ran
        self._task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[None]] = set()  # cancels sent to the front

    @property
    def backend(self) -> Backend:
        return self.delegations.backend

    @property
    def ledger(self) -> ToolLedger:
        return self.delegations.ledger

    @property
    def transcript(self) -> Transcript:
        return self.context.transcript

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
        if self._held_chars + len(text) > self.config.max_turn_chars:
            raise AgentError("invalid", f"a user turn is at most {self.config.max_turn_chars} characters; this "
                             f"chunk would make it {self._held_chars + len(text)} (let the turn end first)")
        t = self._at(t)
        self._held_chars += len(text)
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

    # -- turns decided outside (an audio front's speech turn policy, ``agent/speech_turns.py``) ------
    def hold(self, t: float | None = None, text: str = "", pause: bool = True) -> None:
        """Input while the agent speaks, not (yet) an interruption: ``input.turn`` ``hold`` (the agent
        pauses) or, ``pause=False``, ``backchannel`` (it keeps talking)."""
        self._require_open()
        t = self._at(t)
        self._paused = pause
        self._emit(TurnEvent(t, self.fence.epoch, (Decision.HOLD if pause else Decision.BACKCHANNEL).value, text))
        self._wake.set()

    def resume(self, t: float | None = None, text: str = "") -> None:
        """The held input was a false interruption: ``input.turn`` ``resume``, the reply continues."""
        self._require_open()
        t = self._at(t)
        self._paused = False
        self._emit(TurnEvent(t, self.fence.epoch, Decision.RESUME.value, text))
        self._wake.set()

    def barge_in(self, t: float | None = None, text: str = "") -> None:
        """The user took the floor: the reply in flight is cancelled (its ``response.done``), then
        ``input.turn`` ``barge_in`` in the new epoch. The epoch advances even when no reply is
        generating (an audio front may still be playing one)."""
        self._require_open()
        t = self._at(t)
        generating = self.fence.active
        self._interrupt(t, "barge_in", self.config.cancel_tasks_on_barge_in)
        if not generating:  # the fence advances the epoch only with a reply in flight
            self.fence.interrupt(t, "barge_in")
        self._emit(TurnEvent(t, self.fence.epoch, Decision.BARGE_IN.value, text))
        self._wake.set()

    def user_turn(self, text: str, t: float | None = None, respond: bool = True) -> None:
        """A finished user turn (``input.turn`` ``end_of_turn``): into the context at the next
        boundary, delegated by the policy, answered unless ``respond`` is False (then ``respond()``)."""
        self._require_open()
        if not isinstance(text, str) or len(text) > self.config.max_input_chars:
            raise AgentError("invalid", f"a turn is a string of at most {self.config.max_input_chars} characters")
        self._turn = [text]
        self._end_of_turn(self._at(t), respond)
        self._wake.set()

    def user_partial(self, text: str) -> None:
        """The user's turn so far, still being spoken (an audio front's partial transcript): the
        idle loop prefills and scores it (``prefill.score``); AgentError ``invalid``/``closed``."""
        self._require_open()
        if not isinstance(text, str) or len(text) > self.config.max_input_chars:
            raise AgentError("invalid", f"a partial turn is a string of at most {self.config.max_input_chars} "
                             "characters")
        self.prefill.partial = text if text.strip() else None
        self._wake.set()

    def respond(self, t: float | None = None) -> None:
        """Answer now (OpenAI's ``response.create``): a response is planned from the context."""
        self._require_open()
        self._at(t)
        self._plans.append(_Plan("turn", ""))
        self._wake.set()

    def set_floor(self, user_has_floor: bool) -> None:
        """While the user holds the floor (speaking, or a transcript pending) no response starts."""
        self._user_floor = user_has_floor
        self._wake.set()

    def cancel(self, cancel_tasks: bool = False, advance: bool = False) -> bool:
        """Cancel the response in flight (False if none); ``cancel_tasks`` also cancels open back-end
        tasks; ``advance``: the epoch advances even with nothing in flight (an audio front's reply
        may still be playing: its results become stale)."""
        self._require_open()
        active = self.fence.active
        self._interrupt(self.now(), "cancel", cancel_tasks)
        if advance and not active:
            self.fence.interrupt(self.now(), "cancel")
        self._wake.set()
        return active

    def cancel_delegation(self, delegation_id: str) -> bool:
        """Cancel one back-end task (ledger: cancelled; its result, if it still comes, is ``late``)."""
        return self.delegations.cancel(delegation_id)

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
        keep = min(r.tokens_within(chars), self.context.kept(r.response_id, len(r.token_ids)))  # only shortens
        self.context.queue_truncation(r.response_id, keep, live=set(self.fence.responses))
        self._wake.set()
        return keep

    def deliver_result(self, delegation_id: str, result: str) -> None:
        """A result for a delegation (e.g. a tool the client runs); LedgerError on late/duplicate/unknown."""
        self._require_open()
        self.delegations.deliver(delegation_id, result)

    async def events(self) -> AsyncIterator[AgentEvent]:
        """Every event, in order, until the agent is closed."""
        async for ev in self._stream.events():
            yield ev

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
        self._stream.end()

    # -- state changes --------------------------------------------------------------------------------
    def _interrupt(self, t: float, reason: str, cancel_tasks: bool) -> None:
        if self.fence.active:
            r = self.fence.interrupt(t, reason)
            assert r is not None
            self.stats.interrupts.append(Interrupt(t, r.epoch))
            if self.transcript.has_mark(r.response_id):
                self.context.queue_truncation(r.response_id, len(r.token_ids))
            if self._stepping:
                task = asyncio.get_running_loop().create_task(self.front.cancel())
                self._bg.add(task)
                task.add_done_callback(self._bg.discard)
            self._parser, self._first = None, None
        self._paused = False
        self._plans.clear()
        if cancel_tasks:
            self.delegations.cancel_open()

    def _end_of_turn(self, t: float, respond: bool = True) -> None:
        text = " ".join(self._turn)
        self._held_chars -= sum(map(len, self._turn))
        self._turn = []
        self.prefill.clear()
        self._emit(TurnEvent(t, self.fence.epoch, Decision.END_OF_TURN.value, text))
        self.context.push("user", self.front.encode(f"{self.config.user_prefix} {text}"))
        forced = ""
        decided = self.policy.decide(text) if self.policy is not None else None
        if decided is not None and self.delegations.delegate(decided[0], "policy", t) is not None:
            forced = f" {decided[1]}"
        if respond:
            self._plans.append(_Plan("turn", forced))

    # -- the loop -------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while not self._closed:
                self._tick()
                await self._boundary()
                r = self.fence.current
                if r is not None and not self._paused:
                    await self._step(r)
                    continue
                if r is None and not self._plans and self.prefill.wanted:
                    assert self.prefill.partial is not None
                    turn = self.front.encode(f"{self.config.user_prefix} {self.prefill.partial}")
                    cue0 = self.front.encode(self.config.agent_prefix)[0]
                    await self.prefill.speculate(self.context.peek(), turn, cue0)
                    continue
                if r is None and not self._plans and self.prefill.draft_wanted:
                    await self.prefill.draft(self.front.encode(self.config.agent_prefix)[1:], self.config.step_tokens)
                    continue
                deadline = self.turns.next_deadline()
                timeout = None if deadline is None else max(deadline - self.now(), 0.0) + 0.001
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                self._wake.clear()
        except Exception as exc:  # the front failed (e.g. its context is full): the agent cannot speak any more
            t = self.now()
            if self.fence.current is not None:
                self.fence.finish(self.fence.current.response_id, "failed", t, str(exc))
            self._emit(ErrorEvent(t, self.fence.epoch, "front_failed", f"{type(exc).__name__}: {exc}"))
            self._closed = True

    def _tick(self) -> None:
        t = self.now()
        d = self.turns.on_tick(t)
        if d is Decision.END_OF_TURN:
            self._end_of_turn(t)
        elif d is Decision.RESUME:
            self._emit(TurnEvent(t, self.fence.epoch, d.value, " ".join(self._burst)))
            self._held_chars -= sum(map(len, self._burst))
            self._burst, self._paused = [], False

    async def _boundary(self) -> None:
        if self.context.truncations_queued:
            await self.prefill.settle()  # a truncation rewinds the front to a reply's mark
        await self.context.apply_truncations(lambda item_id: self._emit(ErrorEvent(
            self.now(), self.fence.epoch, "not_found", f"truncation of {item_id} not applied: its checkpoint was "
            "released")))
        floor_free = not self.turns.user_turn_open and not self.turns.burst_open and not self._user_floor
        if self.delegations.has_ready and floor_free:
            self._append_results()
        if not self.fence.active and self._plans and floor_free:
            self._first = self._plans.popleft()
            self.fence.start(self.now(), self._first.cause)
            self._generated = 0
            self._parser = (tool_parser(self.config.tool_call_parser).stream(self.backend.names)
                            if self.config.model_tool_calls else None)

    def _append_results(self) -> None:
        t, cfg, speak = self.now(), self.config, []
        for d in self.delegations.take_ready(self.fence.epoch, t):
            self.context.push("result", self.front.encode(cfg.result_format.format(tool=d.tool, result=d.result)))
            d.t_appended = t
            self._emit(DelegationResult(t, d.epoch, d.delegation_id, "completed", d.result or "", appended=True))
            speak.append(cfg.result_template.format(result=d.result) if cfg.speak_results == "template" else "")
        if not speak:
            return
        if self.fence.current is not None:  # the acknowledgement yields to the answer
            self._finish(self.fence.current, "result")
        self._plans.appendleft(_Plan("result", "".join(speak)))

    async def _step(self, r: Response) -> None:
        epoch, cfg = self.fence.epoch, self.config
        plan, self._first = self._first, None
        first = plan is not None
        forced = self.front.encode(plan.forced) if plan is not None and plan.forced else []
        cue = self.front.encode(cfg.agent_prefix) if first else []
        kept = await self.prefill.keep(self.context.peek() + cue + forced) if first else None
        if first and kept is None:
            await self.prefill.settle()  # the front as the context knows it
        inp = await self.context.step_input(r.response_id, first, cue, forced, kept.mark if kept else None)
        sent = inp[kept.held:] if kept else inp
        if forced:
            assert plan is not None
            self.fence.delta(r.response_id, epoch, plan.forced, tuple(forced), self.now())
        finish, computed, t0, started = None, None, time.perf_counter(), time.monotonic()
        if kept is not None and kept.draft is not None:  # drafted on exactly this input: spoken now
            for chunk in kept.draft.chunks:
                self._on_chunk(r, epoch, chunk)
            finish, computed = kept.draft.finish, 0
        else:
            self._stepping = True
            try:
                async for c in self.front.step(
                    sent, max(1, min(cfg.step_tokens, cfg.max_response_tokens - self._generated))
                ):
                    if isinstance(c, FrontChunk):
                        self._on_chunk(r, epoch, c)
                    else:
                        finish, computed = c.finish_reason, c.computed
            finally:
                self._stepping = False
        if first:
            self.prefill.first_step(sent, computed)
        t = self.now()
        self.stats.step_s.append(time.perf_counter() - t0)
        self.stats.step_at.append(started)
        for it in self.stats.interrupts:
            if it.old_epoch == epoch and it.t_step_end is None:
                it.t_step_end = t
        if self.fence.current is r and self.fence.epoch == epoch and (
                finish == "stop" or self._generated >= cfg.max_response_tokens):
            self._finish(r, finish or "length")

    def _on_chunk(self, r: Response, epoch: int, c: FrontChunk) -> None:
        self.context.record_generated(r.response_id, list(c.token_ids))
        if self.fence.current is not r or self.fence.epoch != epoch:
            self.fence.delta(r.response_id, epoch, c.text, c.token_ids, self.now())  # dropped, counted
            return
        self._generated += len(c.token_ids)
        speech, calls, errors = self._parser.feed(c.text) if self._parser is not None else (c.text, [], [])
        t = self.now()
        self.fence.delta(r.response_id, epoch, speech, c.token_ids, t)
        for call in calls:
            self.delegations.delegate(call, "model", t)
        for e in errors:
            self._emit(ErrorEvent(t, epoch, "invalid_tool_call", e))

    def _finish(self, r: Response, reason: str) -> None:
        t = self.now()
        if self._parser is not None:
            rest, errors = self._parser.end()
            if rest:
                self.fence.delta(r.response_id, self.fence.epoch, rest, (), t)
            for e in errors:
                self._emit(ErrorEvent(t, self.fence.epoch, "invalid_tool_call", e))
            self._parser = None
        self.fence.finish(r.response_id, "completed", t, reason)

    # -- helpers ------------------------------------------------------------------------------------------
    def _emit(self, ev: AgentEvent) -> None:
        self._stream.emit(ev)

    def _set_closed(self) -> None:
        self._closed = True

    def _wake_up(self) -> None:
        self._wake.set()

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
