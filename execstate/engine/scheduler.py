"""Continuous-batching scheduler (pure Python, testable without a model).

Each step has a token budget (``max_num_batched_tokens``) shared by decodes and
(chunked) prefills. Running requests are served first, oldest first; then waiting
requests are admitted in arrival order while budget, sequence slots and KV blocks
last. When a running request needs a block and the pool is empty, the newest running
request is preempted by recompute: its blocks are freed and it goes back to the
front of the waiting queue, keeping its generated tokens and its route rows.

PD decode side (``external``): admission may start an asynchronous KV load instead of
scheduling the request; it then waits in ``loading`` (status WAITING_FOR_REMOTE_KVS, its
blocks allocated, counted against ``max_num_seqs``) while the others keep running. Each
``schedule()`` first applies the loads that finished since the last step: a verified load
is committed (``KVCacheManager.apply_external``) and the request joins ``running``; a
failed one finishes the request with its error (reported in ``SchedulerOutput.failed``).
A request aborted while loading is finished at once, but its blocks are released only when
its load result arrived (the transfer can no longer write them).

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
    # Requests that failed admission or their external load (request-level error): finished.
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
        # Requests whose KV is being loaded (PD), by id; aborted ones stay until their load ends.
        self.loading: dict[str, Request] = {}
        self.num_preemptions = 0
        self.external = external
        self.admit_only: set[Request] | None = None

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        """Requests to run, or loads still in flight (even of aborted requests: their blocks)."""
        return bool(self.waiting or self.running or self.loading)

    @property
    def num_loading(self) -> int:
        return len(self.loading)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._apply_finished_loads(out)
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
        while self.waiting and budget > 0 and len(self.running) + len(self.loading) < self.max_num_seqs:
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
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.num_computed_tokens - req.num_transferred_tokens
            if req.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.loading[req.request_id] = req  # not scheduled until its KV arrived
                continue
            n = min(req.remaining_tokens, budget)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n, req.num_computed_tokens))
            budget -= n
        return out

    def _apply_finished_loads(self, out: SchedulerOutput) -> None:
        if self.external is None or not self.loading:
            return
        for done in self.external.finished_loads():
            req = self.loading.pop(done.request.request_id, None)
            if req is None or req is not done.request:
                raise RuntimeError(f"a load finished for request {done.request.request_id!r}, which is not loading")
            if req.is_finished:  # aborted while loading: the transfer is over, the blocks are free now
                self.kv.release(req, finished=True)
                continue
            if done.load.error is not None:
                req.abort_message = done.load.error
                self.kv.release(req, finished=True)
                req.status = RequestStatus.FINISHED_ABORTED
                out.failed.append(req)
                continue
            self.kv.apply_external(req, done.load)
            req.status = RequestStatus.RUNNING
            self.running.append(req)

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
        if self.loading.get(req.request_id) is req:
            # The transfer may still write its blocks: keep them (and the entry) until it ends.
            req.status = status
            assert self.external is not None
            self.external.cancel_load(req)
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req, finished=True)
        req.status = status

    def abort(self, request_id: str) -> Request | None:
        loading = [r for r in self.loading.values() if not r.is_finished]
        for req in list(self.running) + list(self.waiting) + loading:
            if req.request_id == request_id:
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                return req
        return None
