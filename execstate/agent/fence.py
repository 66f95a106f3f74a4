"""Responses and the front epoch: the one place that emits response events (pure Python).

Contract:

- ``epoch`` is the front epoch. ``interrupt`` (a barge-in or a cancel) advances it by one and, in
  the same call, ends the response in flight with ``response.done`` ``cancelled``: atomic for the
  caller (one thread or one event loop; nothing is emitted between the two).
- ``start`` opens a response in the current epoch (at most one at a time); ``delta`` emits output
  only if the response is the one in flight *and* the epoch it was produced in (the epoch the
  producing step started in) is the current one; otherwise it is dropped and ``delta`` returns
  False. ``finish`` ends the response in flight (``completed`` or ``failed``) once; a second finish,
  or a finish of a response already ended, returns False and emits nothing.
- Hence: every response gets exactly one terminal event, and no delta of an epoch is emitted
  after that epoch's interrupt (so none after its response's terminal event).
- ``responses`` keeps the last ``remember`` responses (the agent truncates recent ones only).
- ``dropped`` counts suppressed deltas; ``last_old_epoch_emit_t`` the time of the last delta
  emitted in each epoch (for the interruption latency metric).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from execstate.agent.agent_events import AgentEvent, OutputDelta, ResponseCreated, ResponseDone, ResponseId

TERMINAL = ("completed", "cancelled", "failed")


@dataclass
class Response:
    response_id: ResponseId
    epoch: int
    cause: str
    t_created: float
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    delta_ends: list[int] = field(default_factory=list)  # cumulative chars after each delta
    delta_tokens: list[int] = field(default_factory=list)  # cumulative tokens after each delta
    status: str | None = None  # a terminal status once ended

    @property
    def emitted_text(self) -> str:
        return "".join(self.text)

    def tokens_within(self, played_chars: int) -> int:
        """How many of the emitted tokens were delivered when ``played_chars`` characters of the
        text were played: whole deltas only (a partly played delta is not kept)."""
        keep = 0
        for end, ntok in zip(self.delta_ends, self.delta_tokens, strict=True):
            if end > played_chars:
                break
            keep = ntok
        return keep


class ResponseFence:
    def __init__(self, emit: Callable[[AgentEvent], None], id_prefix: str = "resp", remember: int = 64) -> None:
        self.remember = remember
        self._emit = emit
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self.epoch = 0
        self.current: Response | None = None
        self.responses: dict[ResponseId, Response] = {}
        self.dropped = 0
        self.last_emit_t: dict[int, float] = {}  # epoch -> time of its last emitted delta

    @property
    def active(self) -> bool:
        return self.current is not None

    def start(self, t: float, cause: str) -> Response:
        if self.current is not None:
            raise RuntimeError(f"response {self.current.response_id} is still in flight")
        r = Response(ResponseId(f"{self._prefix}_{next(self._ids)}"), self.epoch, cause, t)
        self.current = r
        self.responses[r.response_id] = r
        while len(self.responses) > self.remember:  # the oldest (ended) ones are forgotten
            del self.responses[next(iter(self.responses))]
        self._emit(ResponseCreated(t, r.epoch, r.response_id, cause))
        return r

    def delta(self, response_id: ResponseId, epoch: int, text: str, token_ids: tuple[int, ...], t: float) -> bool:
        r = self.current
        if r is None or r.response_id != response_id or epoch != self.epoch or r.epoch != epoch:
            self.dropped += 1
            return False
        r.text.append(text)
        r.token_ids.extend(token_ids)
        r.delta_ends.append((r.delta_ends[-1] if r.delta_ends else 0) + len(text))
        r.delta_tokens.append(len(r.token_ids))
        if text:  # tokens without speech (a held-back tool call) are recorded, not emitted
            self.last_emit_t[epoch] = t
            self._emit(OutputDelta(t, epoch, response_id, text, tuple(token_ids)))
        return True

    def finish(self, response_id: ResponseId, status: str, t: float, reason: str = "") -> bool:
        if status not in ("completed", "failed"):
            raise ValueError(f"finish takes 'completed' or 'failed', got {status!r} (cancel: interrupt)")
        r = self.current
        if r is None or r.response_id != response_id:
            return False
        self._end(r, status, t, reason)
        return True

    def interrupt(self, t: float, reason: str) -> Response | None:
        """Advance the epoch and cancel the response in flight (returned, or None)."""
        self.epoch += 1
        r = self.current
        if r is not None:
            self._end(r, "cancelled", t, reason)
        return r

    def _end(self, r: Response, status: str, t: float, reason: str) -> None:
        r.status = status
        self.current = None
        self._emit(ResponseDone(t, r.epoch, r.response_id, status, reason, r.emitted_text))
