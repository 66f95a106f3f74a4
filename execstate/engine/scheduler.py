"""Continuous-batching scheduler (pure Python, testable without a model).

Each step has a token budget (``max_num_batched_tokens``) shared by decodes and
(chunked) prefills. Running requests are served first, oldest first; then waiting
requests are admitted in arrival order while budget, sequence slots and KV blocks
last. When a running request needs a block and the pool is empty, the newest running
request is preempted by recompute: its blocks are freed and it goes back to the
front of the waiting queue, keeping its generated tokens and its route rows.

Contract with the engine: ``schedule()`` returns what to run; after the forward pass
the engine calls ``on_computed`` for each scheduled request, then ``finish`` for
those that stopped. ``abort`` may be called at any time between steps.

Admission hold: while ``admit_only`` is a set (a weight update draining the requests in
flight), only waiting requests in it are admitted; the first waiting request outside it
stops admission for the step (arrival order is kept), so newer requests wait.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from execstate.engine.kv_cache_manager import ExternalLoadError, ExternalPrefix, KVCacheManager
from execstate.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    num_computed_before: int

    @property
    def samples(self) -> bool:
        """True if this chunk reaches the end of the request's known tokens."""
        return self.num_computed_before + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Requests that failed admission (external load failed under policy "fail"): finished.
    failed: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 64,
        external: ExternalPrefix | None = None,
    ) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.external = external
        self.admit_only: set[Request] | None = None

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.remaining_tokens, budget)
            before = req.num_computed_tokens
            while not self.kv.allocate(req, n):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break
            out.scheduled.append(ScheduledRequest(req, n, before))
            budget -= n
            i += 1
        if out.preempted:
            return out  # the pool is full: admit nothing new this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if self.admit_only is not None and req not in self.admit_only:
                break
            try:
                hits = self.kv.admit(req, budget, self.external)
            except ExternalLoadError as e:
                req.abort_message = str(e)
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                out.failed.append(req)
                continue
            if hits is None:
                break
            self.waiting.popleft()
            n = min(req.remaining_tokens, budget)
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.num_computed_tokens - req.num_transferred_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n, req.num_computed_tokens))
            budget -= n
        return out

    def _preempt(self, req: Request) -> None:
        self.kv.release(req, finished=False)
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def on_computed(self, s: ScheduledRequest) -> None:
        """The forward pass computed ``s``'s tokens: advance and commit full blocks."""
        s.request.num_computed_tokens = s.num_computed_before + s.num_new_tokens
        self.kv.commit(s.request)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Finish a request exactly once: release its blocks and route leases."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req, finished=True)
        req.status = status

    def abort(self, request_id: str) -> Request | None:
        for req in list(self.running) + list(self.waiting):
            if req.request_id == request_id:
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                return req
        return None
