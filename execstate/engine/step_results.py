"""What a forward pass's result becomes: routes recorded, progress committed, tokens sampled,
requests finished or streamed. The second half of ``LLMEngine.step``.

Contract of ``StepResults.apply(sched, result, out)`` (``result``: ``ModelRunner.execute(sched)``):

1. the captured routes go into each request's route trace at the positions computed
   (keep-first: ``RouteTrace.fill``), timed on the R3 clock;
2. every scheduled span is committed (``Scheduler.on_computed``: computed tokens, full blocks
   into the prefix cache with their route records), and its scored prompt rows recorded
   (``engine/prompt_logprobs.py``);
3. the rows that sample draw one token each (``engine/sampler.py``; EOS and stop ids banned
   below ``min_tokens``; constrained rows under ``mask``, the grammar masks computed during the
   forward pass, or, greedy ones on the host, ``deferred``: masked only where the grammar refuses
   their argmax, ``engine/grammar_argmax.py``), appended with its logprobs to the request; the
   sampling itself runs first, on the logits' device, because reading its ids back is the step's
   one wait on that device (1 and 2 read the routes it copied back);
4. a constrained request's matcher accepts the token (a refused token fails the request with
   ``error`` set; a grammar that is complete stops it, ``"stop"``);
   ``on_new_token`` decides whether it stops; a stopping request goes through ``export``
   (the engine's PD producer hook: the status it finishes with, ``"abort"`` when the export
   failed) and is finished by the scheduler and the finisher; otherwise, unless it asked for
   its final output only, an output is built now (streaming).

The outputs are appended to ``out`` in sampling order as they are made, so a step that raises
midway still delivers what it produced (``engine/step_failure.py``). Threads: the engine thread
only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from execstate.engine.finisher import RequestFinisher
from execstate.engine.output_builder import build_output, on_new_token
from execstate.engine.outputs import RequestOutput
from execstate.engine.prompt_logprobs import record_rows
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request, RequestStatus
from execstate.engine.runner_output import RunnerOutput
from execstate.engine.sampler import sample
from execstate.engine.sampling_params import RequestOutputKind
from execstate.engine.scheduler import Scheduler, SchedulerOutput
from execstate.engine.token_mask import DeferredMask, TokenMask
from execstate.engine.tokenizer import Tokenizer

# (request, the status it stops with) -> the status it finishes with
ExportHook = Callable[[Request, RequestStatus], RequestStatus]


class StepResults:
    """Applies a step's forward-pass result (module docstring)."""

    def __init__(self, scheduler: Scheduler, finisher: RequestFinisher, tokenizer: Tokenizer | None,
                 eos_token_ids: set[int], return_routes: bool, r3_clock: R3Clock, export: ExportHook) -> None:
        self._scheduler = scheduler
        self._finisher = finisher
        self._tokenizer = tokenizer
        self._eos_token_ids = eos_token_ids
        self._return_routes = return_routes
        self._r3_clock = r3_clock
        self._export = export

    def apply(self, sched: SchedulerOutput, result: RunnerOutput, out: list[RequestOutput],
              mask: TokenMask | None = None, deferred: DeferredMask | None = None) -> None:
        reqs = [sched.scheduled[i].request for i in result.sample_rows]
        sampled = None
        if reqs:  # first: reading the sampled ids is the step's one wait on the device
            banned = [self._banned(r) for r in reqs]
            sampled = sample(result.logits, [r.params for r in reqs], [r.sampling.generator for r in reqs], banned,
                             [r.sampling.penalties for r in reqs], mask, device_algorithms=result.device_step,
                             deferred=deferred)
        if result.routes is not None:
            result.wait()  # the route copy is done (free after the sampled ids were read)
            t_r3 = time.perf_counter()
            for s, off in zip(sched.scheduled, result.token_offsets, strict=True):
                if s.request.routes is not None:
                    s.request.routes.fill(s.num_computed_before, result.routes[off : off + s.num_new_tokens])
            self._r3_clock.add_since(t_r3)
        for s in sched.scheduled:
            self._scheduler.on_computed(s)
        record_rows(result.prompt_rows)
        if sampled is None:
            return
        now = time.monotonic()
        for j, req in enumerate(reqs):
            if result.hidden is not None and req.params.return_hidden and not req.output_token_ids:
                req.output.hidden = result.hidden[j].numpy()
            req.append_output_token(sampled.token_ids[j])
            req.output.logprobs.append(sampled.logprobs[j])
            req.output.top_logprobs.append(sampled.top_logprobs[j])
            if req.first_token_time is None:
                req.first_token_time = now
            grammar_status = _advance_grammar(req) if req.grammar is not None else None
            status = on_new_token(req, self._eos_token_ids, self._tokenizer)
            # a refused token aborts; a complete grammar stops, as EOS would, even on the length limit's token
            if grammar_status is RequestStatus.FINISHED_ABORTED or (
                    grammar_status is not None and status in (None, RequestStatus.FINISHED_LENGTH)):
                status = grammar_status
            if status is not None:
                status = self._export(req, status)
                self._scheduler.finish(req, status)
                out.append(self._finisher.finalize(req))
            elif req.params.output_kind is not RequestOutputKind.FINAL_ONLY:
                out.append(build_output(req, self._tokenizer, self._return_routes))

    def _banned(self, req: Request) -> list[int]:
        if req.num_output_tokens >= req.params.min_tokens:
            return []
        return sorted(self._eos_token_ids | set(req.params.stop_token_ids or []))


def _advance_grammar(req: Request) -> RequestStatus | None:
    """The matcher takes the request's newest token: ``"abort"`` (with the reason) when it refuses
    it, ``"stop"`` when the grammar is complete, else None."""
    g = req.grammar
    assert g is not None
    if not g.accept(req.all_token_ids[-1]):
        req.abort_message = f"the sampled token does not match the structured output grammar: {g.error}"
        return RequestStatus.FINISHED_ABORTED
    return RequestStatus.FINISHED_STOPPED if g.stopped else None
