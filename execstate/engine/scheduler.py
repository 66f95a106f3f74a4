"""Continuous-batching scheduler (pure Python, testable without a model).

Each step has a token budget (``max_num_batched_tokens``) shared by decodes and
(chunked) prefills; a request with ``max_chunk_tokens`` (one that scores its prompt,
``engine/prompt_logprobs.py``) runs at most that many of it per step (``Request.chunk``).
Running requests are served first, oldest first; then waiting
requests are admitted in arrival order while budget, sequence slots and KV blocks
last. When a running request needs a block and the pool is empty, the newest running
request is preempted by recompute: its blocks are freed and it goes back to the
front of the waiting queue, keeping its generated tokens and its route rows.

Priority classes (``Request.priority``, higher first: ``PRIORITY_INTERACTIVE`` session
steps above ``PRIORITY_BATCH`` requests): the rules above apply class by class, from the
highest: a class's running requests, then its waiting ones, then the next class, so the
budget goes to higher classes first. ``waiting`` and ``running`` are kept ordered by class
(arrival order within one; a preempted request returns to the front of its class).
Preemption victims are the newest running requests of the lowest class; a waiting request
that finds no sequence slot or no blocks may preempt running requests of *lower* classes
(never of its own). Without priorities (every request in one class) nothing changes.

Batch budget under interactive work (``batch_budget``, None: off): while an interactive request
(class >= ``PRIORITY_INTERACTIVE``) is running or waiting, the requests of lower classes share at
most ``batch_budget`` tokens of each step: chunked prefills are cut to what is left of it, and
once it is spent the remaining lower-class requests are not served this step (running ones keep
their blocks and are served, oldest first, when budget is left again). So a front step's forward
pass stays small whatever the batch load; the batch throughput given up is measured by
``execstate bench duplex``. Steps with no interactive request give the batch classes the whole
``max_num_batched_tokens``, but for the hold after one (``hold``, ``engine/interactive_hold.py``;
None: none): when an interactive request finishes, the lower classes get no tokens until the hold
ends, so the front's next step, expected within it, finds the engine free; ``hold_remaining()``
tells the engine how long a step left empty by the hold should wait for a command.

PD decode side (``external``: the PD connector's loads, given at construction like
``offload``): admission may start an asynchronous KV load instead of
scheduling the request; it then waits in ``loading`` (status WAITING_FOR_REMOTE_KVS, its
blocks allocated, counted against ``max_num_seqs``) while the others keep running. Each
``schedule()`` first applies the loads that finished since the last step: a verified load
is committed (``KVCacheManager.apply_external``) and the request joins ``running``; a
failed one finishes the request with its error (reported in ``SchedulerOutput.failed``).
A request aborted while loading is finished at once, but its blocks are released only when
its load result arrived (the transfer can no longer write them).

Offload tiers (``offload``, given at construction: ``engine/offload_loads.py``): the same protocol and the same
``loading`` state for a request whose prompt blocks missed the prefix cache but are in a tier;
a request's source is ``external`` when it carries a PD handoff, else ``offload``.

Contract with the engine: ``schedule()`` returns what to run; after the forward pass
the engine calls ``on_computed`` for each scheduled request, then ``finish`` for
those that stopped. ``abort`` may be called at any time between steps.

Admission hold: while ``admit_only`` is a set (a weight update draining the requests in
flight), only waiting requests in it are admitted, in queue order; a waiting request outside
it (newer than every request in it) is passed over and waits for the switch, even when its
class puts it ahead of them in the queue, so the drain never waits on a request it holds back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from execstate.engine.external_prefix import ExternalLoadError, ExternalPrefix
from execstate.engine.interactive_hold import InteractiveHold
from execstate.engine.kv_cache_manager import KVCacheManager

# re-exported for the benchmarks and tests that import them from here (engine/priority.py is their home)
from execstate.engine.priority import PRIORITY_BATCH as PRIORITY_BATCH
from execstate.engine.priority import PRIORITY_INTERACTIVE as PRIORITY_INTERACTIVE
from execstate.engine.request import Request, RequestStatus
from execstate.state.block_pool import BlockId


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
    # Copy-on-write block copies (src, dst) to run before the forward pass (KVCacheManager).
    block_copies: list[tuple[BlockId, BlockId]] = field(default_factory=list)

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
        batch_budget: int | None = None,
        offload: ExternalPrefix | None = None,
        hold: InteractiveHold | None = None,
    ) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if batch_budget is not None and (isinstance(batch_budget, bool) or not isinstance(batch_budget, int)
                                         or batch_budget < 0):
            raise ValueError(f"batch_budget must be None or an integer >= 0, got {batch_budget!r}")
        self.batch_budget = batch_budget
        self.hold = hold
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Requests whose KV is being loaded (PD), by id; aborted ones stay until their load ends.
        self.loading: dict[str, Request] = {}
        self.num_preemptions = 0
        self.external = external
        self.offload = offload
        self.admit_only: set[Request] | None = None

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self._enqueue(req, front=False)

    def _enqueue(self, req: Request, front: bool) -> None:
        """Into ``waiting`` at the back (or, ``front``, the front) of its priority class."""
        w = self.waiting
        if not w or (w[-1].priority >= req.priority and not front):
            w.append(req)
            return
        i = 0
        while i < len(w) and (w[i].priority > req.priority or (w[i].priority == req.priority and not front)):
            i += 1
        w.insert(i, req)

    def _start_running(self, req: Request) -> None:
        """Into ``running`` after the running requests of its class and of higher ones."""
        r = self.running
        i = len(r)
        while i > 0 and r[i - 1].priority < req.priority:
            i -= 1
        r.insert(i, req)

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
        low_left = self._low_class_budget()  # tokens left for the classes below interactive (None: no cap)
        admitting = True
        i = 0  # next running request to serve: running[:i] are scheduled (or preempted)
        while budget > 0:
            run_cls = self.running[i].priority if i < len(self.running) else None
            head = self._admissible() if admitting else None
            wait_cls = head.priority if head is not None else None
            if run_cls is None and wait_cls is None:
                break
            top = max(c for c in (run_cls, wait_cls) if c is not None)
            cap = low_left if top < PRIORITY_INTERACTIVE else None
            if cap == 0:
                break  # every request left is of a lower class: its share of this step is spent
            room = budget if cap is None else min(budget, cap)
            if run_cls is not None and (wait_cls is None or run_cls >= wait_cls):
                req = self.running[i]
                n = req.chunk(room)
                before = req.num_computed_tokens
                while not self.kv.allocate(req, n):
                    victim = self.running.pop()  # the newest of the lowest class
                    self._preempt(victim)
                    out.preempted.append(victim)
                    admitting = False  # the pool is full: admit nothing new this step
                    if victim is req:
                        break
                if req.status is not RequestStatus.RUNNING:
                    break
                out.scheduled.append(ScheduledRequest(req, n, before))
                budget -= n
                if cap is not None:
                    low_left = cap - n
                i += 1
                continue
            admitted = self._admit_head(out, room, i)
            if admitted is None:
                admitting = False
                continue
            if admitted:
                budget -= out.scheduled[-1].num_new_tokens
                if cap is not None:
                    low_left = cap - out.scheduled[-1].num_new_tokens
                i += 1
        out.block_copies = self.kv.take_block_copies()
        return out

    def _low_class_budget(self) -> int | None:
        """``batch_budget`` when an interactive request runs or waits (both lists are ordered by
        class, highest first, so their heads tell), else 0 while the hold lasts, else None."""
        if self._interactive_present():
            return self.batch_budget
        return 0 if self.hold is not None and self.hold.held else None

    def _interactive_present(self) -> bool:
        heads = [q[0].priority for q in (self.running, self.waiting) if q]
        return bool(heads) and max(heads) >= PRIORITY_INTERACTIVE

    def hold_remaining(self) -> float:
        """Seconds the hold still keeps the lower classes' waiting or running requests from a step
        (0.0: not held, or nothing is held back)."""
        if self.hold is None or not (self.running or self.waiting) or self._interactive_present():
            return 0.0
        return self.hold.remaining()

    def _admissible(self) -> Request | None:
        """The first waiting request admission may take: ``waiting[0]``, or during a drain the
        first one in ``admit_only`` (module docstring); None if there is none."""
        if self.admit_only is None:
            return self.waiting[0] if self.waiting else None
        return next((r for r in self.waiting if r in self.admit_only), None)

    def _admit_head(self, out: SchedulerOutput, budget: int, served: int) -> bool | None:
        """Admit ``_admissible()``: True if it was scheduled (inserted at ``running[served]``),
        False if it left the queue otherwise (failed, or loading), None if it cannot be admitted
        now. Running requests of lower classes not yet served (``running[served:]``) may be
        preempted for its sequence slot or its blocks."""
        req = self._admissible()
        if req is None:
            return None
        while len(self.running) + len(self.loading) >= self.max_num_seqs:
            if not self._preempt_lower(req, out, served):
                return None
        while True:
            try:
                hits = self.kv.admit(req, min(budget, req.max_chunk_tokens or budget), self._source(req))
            except ExternalLoadError as e:
                self.waiting.remove(req)
                req.abort_message = str(e)
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                out.failed.append(req)
                return False
            if hits is not None:
                break
            if not self._preempt_lower(req, out, served):
                return None
        self.waiting.remove(req)
        if req.num_cached_tokens is None:
            req.num_cached_tokens = req.num_computed_tokens - req.num_transferred_tokens
        if req.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.loading[req.request_id] = req  # not scheduled until its KV arrived
            return False
        n = req.chunk(budget)
        req.status = RequestStatus.RUNNING
        self.running.insert(served, req)
        out.scheduled.append(ScheduledRequest(req, n, req.num_computed_tokens))
        return True

    def _preempt_lower(self, req: Request, out: SchedulerOutput, served: int) -> bool:
        """Preempt the newest running request of a class below ``req``'s that this step has not
        served yet; False if there is none."""
        if len(self.running) <= served or self.running[-1].priority >= req.priority:
            return False
        victim = self.running.pop()
        self._preempt(victim)
        out.preempted.append(victim)
        return True

    def _source(self, req: Request) -> ExternalPrefix | None:
        """Where ``req``'s prefix may be loaded from: PD with a handoff, else the offload tiers."""
        if req.transfer.handoff is not None or self.offload is None:
            return self.external
        return self.offload

    def _apply_finished_loads(self, out: SchedulerOutput) -> None:
        if not self.loading:
            return
        sources = [src for src in (self.external, self.offload) if src is not None]
        for done in [d for src in sources for d in src.finished_loads()]:
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
            self._start_running(req)

    def _preempt(self, req: Request) -> None:
        self.kv.release(req, finished=False)
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(req, front=True)

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
            source = self._source(req)
            assert source is not None
            source.cancel_load(req)
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req, finished=True)
        req.status = status
        if self.hold is not None and req.priority >= PRIORITY_INTERACTIVE:
            self.hold.start()

    def abort(self, request_id: str) -> Request | None:
        loading = [r for r in self.loading.values() if not r.is_finished]
        for req in list(self.running) + list(self.waiting) + loading:
            if req.request_id == request_id:
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                return req
        return None
