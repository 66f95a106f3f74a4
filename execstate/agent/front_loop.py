"""The loop half of ``DuplexAgent`` (``agent/duplex.py``): state changes and the front's step loop.

``FrontLoop`` holds no state of its own: every attribute it uses is set in
``DuplexAgent.__init__``; only ``DuplexAgent`` subclasses it. The contract (order of one loop
turn, the fence, results, truncation) is in ``agent/duplex.py``'s module docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from execstate.agent.agent_events import (
    DelegationCreated,
    DelegationId,
    DelegationResult,
    ErrorEvent,
    TurnEvent,
)
from execstate.agent.delegation import ToolCall, ToolCallParser
from execstate.agent.fence import Response
from execstate.agent.front import FrontChunk
from execstate.agent.ledger import Delegation, DelegationState, LedgerError
from execstate.agent.turn_policy import Decision


class AgentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Interrupt:
    t_accept: float
    old_epoch: int
    t_step_end: float | None = None  # when the front's cancelled step ended (None: no step was running)


@dataclass
class AgentStats:
    step_s: list[float] = field(default_factory=list)
    interrupts: list[Interrupt] = field(default_factory=list)


@dataclass
class _Plan:
    cause: str  # "turn" | "result"
    forced: str  # spoken first ("": the model speaks from the start)


_END = object()



class FrontLoop:
    # -- state changes --------------------------------------------------------------------------------
    def _interrupt(self, t: float, reason: str, cancel_tasks: bool) -> None:
        if self.fence.active:
            r = self.fence.interrupt(t, reason)
            assert r is not None
            self.stats.interrupts.append(Interrupt(t, r.epoch))
            if self.transcript.has_mark(r.response_id):
                self._truncs.append((r.response_id, len(r.token_ids)))
                self._kept[r.response_id] = len(r.token_ids)
            if self._stepping:
                task = asyncio.get_running_loop().create_task(self.front.cancel())
                self._bg.add(task)
                task.add_done_callback(self._bg.discard)
            self._parser, self._first = None, None
        self._paused = False
        self._plans.clear()
        if cancel_tasks:
            for did in self.ledger.open_ids():
                self.cancel_delegation(did)

    def _on_result(self, delegation_id: DelegationId, result: str | None, error: str | None) -> None:
        if self._closed:
            return
        try:
            d = self.ledger.resolve(delegation_id, result, self.fence.epoch, self.now(), error)
        except LedgerError as exc:
            self._emit(ErrorEvent(self.now(), self.fence.epoch, exc.code, exc.message))
            return
        self._settle(d)

    def _settle(self, d: Delegation) -> None:
        if d.state is DelegationState.COMPLETED:
            self._ready.append(d.delegation_id)
            self._wake.set()
        else:
            self._emit(DelegationResult(self.now(), self.fence.epoch, d.delegation_id, d.state.value,
                                        d.result or "", d.error or ""))

    def _delegate(self, call: ToolCall, source: str, t: float) -> bool:
        if call.tool not in self.backend.tools:
            self._emit(ErrorEvent(t, self.fence.epoch, "unknown_tool", f"no back-end tool {call.tool!r}"))
            return False
        try:
            d = self.ledger.open(call.tool, call.arguments, self.fence.epoch, t, source)
        except LedgerError as exc:
            self._emit(ErrorEvent(t, self.fence.epoch, exc.code, exc.message))
            return False
        self._emit(DelegationCreated(t, d.epoch, d.delegation_id, d.tool, dict(d.arguments), source))
        self.backend.start(d, self._on_result)
        return True

    def _end_of_turn(self, t: float) -> None:
        text = " ".join(self._turn)
        self._turn = []
        self._emit(TurnEvent(t, self.fence.epoch, Decision.END_OF_TURN.value, text))
        self._pending.append(("user", self.front.encode(f"{self.config.user_prefix} {text}")))
        forced = ""
        decided = self.policy.decide(text) if self.policy is not None else None
        if decided is not None and self._delegate(decided[0], "policy", t):
            forced = f" {decided[1]}"
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
            self._burst, self._paused = [], False

    async def _boundary(self) -> None:
        # latest item first: an earlier item's rewind re-appends the later ones (already cut) and
        # releases their checkpoints
        order = sorted(self._truncs, key=lambda tk: self.transcript.mark_index(tk[0])
                       if self.transcript.has_mark(tk[0]) else -1, reverse=True)
        for item_id, keep in order:
            if not self.transcript.has_mark(item_id):  # released since it was asked for (an earlier
                # truncation re-appended it, or newer responses pushed its checkpoint out): say so, go on
                self._emit(ErrorEvent(self.now(), self.fence.epoch, "not_found",
                                      f"truncation of {item_id} not applied: its checkpoint was released"))
                continue
            mark, tokens, released = self.transcript.plan_truncate(item_id, keep)
            await self.front.rewind(mark)
            self._replay, self._replay_from = tokens, self.transcript.mark_index(item_id)
            for m in released:
                await self.front.release(m)
        self._truncs.clear()
        floor_free = not self.turns.user_turn_open and not self.turns.burst_open
        if self._ready and floor_free:
            self._append_results()
        if not self.fence.active and self._plans and floor_free:
            self._first = self._plans.popleft()
            self.fence.start(self.now(), self._first.cause)
            self._generated = 0
            self._parser = ToolCallParser(self.backend.names) if self.config.model_tool_calls else None

    def _append_results(self) -> None:
        t, cfg, speak = self.now(), self.config, []
        while self._ready:
            d = self.ledger.get(self._ready.popleft())
            if d.epoch != self.fence.epoch:
                self.ledger.mark_stale(d.delegation_id)
                self._emit(DelegationResult(t, self.fence.epoch, d.delegation_id, "stale", d.result or ""))
                continue
            self._pending.append(("result", self.front.encode(cfg.result_format.format(tool=d.tool, result=d.result))))
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
        held = self._replay_from if self._replay else None  # what the front holds now, in segments
        inp, self._replay = self._replay, []
        plan, self._first = self._first, None
        if plan is not None:
            for m in self.transcript.add_mark(r.response_id, await self.front.mark(), held):
                await self.front.release(m)
        for role, toks in self._pending:
            self.transcript.append(role, toks)
            inp += toks
        self._pending = []
        if plan is not None:
            prefix = self.front.encode(cfg.agent_prefix)
            self.transcript.append("prefix", prefix, r.response_id)
            inp += prefix
            if plan.forced:
                forced = self.front.encode(plan.forced)
                self.transcript.append("agent", forced, r.response_id)
                inp += forced
                self.fence.delta(r.response_id, epoch, plan.forced, tuple(forced), self.now())
        finish, t0 = None, time.perf_counter()
        self._stepping = True
        try:
            async for c in self.front.step(inp, max(1, min(cfg.step_tokens, cfg.max_response_tokens - self._generated))):
                if isinstance(c, FrontChunk):
                    self._on_chunk(r, epoch, c)
                else:
                    finish = c.finish_reason
        finally:
            self._stepping = False
        t = self.now()
        self.stats.step_s.append(time.perf_counter() - t0)
        for it in self.stats.interrupts:
            if it.old_epoch == epoch and it.t_step_end is None:
                it.t_step_end = t
        if self.fence.current is r and self.fence.epoch == epoch and (
                finish == "stop" or self._generated >= cfg.max_response_tokens):
            self._finish(r, finish or "length")

    def _on_chunk(self, r: Response, epoch: int, c: FrontChunk) -> None:
        self.transcript.append("agent", list(c.token_ids), r.response_id)
        if self.fence.current is not r or self.fence.epoch != epoch:
            self.fence.delta(r.response_id, epoch, c.text, c.token_ids, self.now())  # dropped, counted
            return
        self._generated += len(c.token_ids)
        speech, calls, errors = self._parser.feed(c.text) if self._parser is not None else (c.text, [], [])
        t = self.now()
        self.fence.delta(r.response_id, epoch, speech, c.token_ids, t)
        for call in calls:
            self._delegate(call, "model", t)
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
        self.fence.finish(r.response_id, "done", t, reason)

