"""The engine: requests in, one scheduled forward pass per ``step()``, outputs out.

Call order: ``add_request`` (validates; raises ValueError and changes nothing on bad
input) → ``step()`` repeatedly while ``has_unfinished_requests()`` → outputs. Every
request is finished exactly once (stop, length, abort), which releases its blocks and
route leases.

Weight updates (``update_weights``: ``engine/engine_weights.py``, rules in
``engine/weight_update.py``): tensors are
copied in place; the weights version (a digest of the loaded tensors, or a version the
trainer supplies) is part of every block key, so units computed with old weights can
never be hit by requests admitted afterwards; no cache reset is needed. Requests in
flight at the update are never continued across it (that would mix KV and routes of two
weight versions in one trace, which an RL trainer cannot replay): policy ``abort``
finishes them with finish_reason ``"abort"``; policy ``drain`` lets them finish on the
old weights, holding newer requests back until the switch.

Failure isolation: a step that raises fails the requests of that step (finish_reason
``"abort"``, ``error`` set) and the engine goes on serving; only when shared state fails
its integrity checks afterwards does ``step`` raise (``EngineCorruptedError``). See
``step_failure``.

Session steps (``add_step_request``, used by ``session/``): a request that arrives holding the
session's blocks (``HeldBlocks`` registered in ``kv_holds``) and hands them back at finish;
``on_finished`` runs in ``_finalize``, on the engine thread, before the final output is
returned. References held by sessions and checkpoints live in ``kv_holds`` and count in the
failed-step reference check. When waiting requests cannot be admitted because holds fill the
pool (nothing running), the engine asks the holds' owner to reclaim (evict an idle session);
if it cannot, the first waiting request fails with an error saying why (never a hang).

PD decode side: a request whose KV is loaded from a prefill instance waits in its own
state while the others keep stepping (``engine/pd_connector.py``). When every unfinished
request is waiting for a load, ``step()`` blocks until a load finishes, ``wake()`` is called
(any thread: the ``AsyncEngine`` calls it for each command) or 50 ms pass.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from execstate.engine.cache_salt import cache_salt_of
from execstate.engine.config import EngineConfig
from execstate.engine.engine_weights import EngineWeights
from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.model_numerics import activation_dtype, load_engine_model, numerics_id
from execstate.engine.output_builder import build_output, on_new_token
from execstate.engine.outputs import RequestOutput
from execstate.engine.penalties import PenaltyState
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request, RequestStatus
from execstate.engine.route_trace import RouteTrace
from execstate.engine.runner import ModelRunner
from execstate.engine.sampler import sample
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.scheduler import Scheduler
from execstate.engine.step_failure import EngineFatalError, StepState, fail_step
from execstate.engine.step_request import StepRequest, build_step_request
from execstate.engine.tokenizer import Tokenizer
from execstate.engine.validation import (
    validate_forced_routes,
    validate_logit_bias,
    validate_prompt,
    validate_sampling,
)
from execstate.engine.weight_update import WeightUpdate
from execstate.identity.provenance import Provenance
from execstate.model.registry import resolve_model
from execstate.model.weights_digest import model_digest
from execstate.state.block_holds import BlockHolds
from execstate.state.block_pool import BlockPool
from execstate.state.kv_pool import KVPool
from execstate.state.route_store import RouteStore
from execstate.transfer.errors import TransferError
from execstate.transfer.handoff import Handoff, wants_remote_prefill

if TYPE_CHECKING:
    from execstate.engine.pd_connector import PDConfig, PDConnector

logger = logging.getLogger(__name__)
PromptType = str | list[int] | dict[str, Any]
# Longest wait of an idle step (every unfinished request waiting for a KV load) without a wake-up.
_IDLE_WAIT_S = 0.05


class LLMEngine(EngineWeights):
    def __init__(self, config: EngineConfig) -> None:
        t0 = time.perf_counter()
        self.config = config
        self.model_path: Path = resolve_model(config.model)
        act_dtype = activation_dtype(config)  # activations and KV cache
        self.model = load_engine_model(self.model_path, config)  # in its numerics mode
        self.model_config = mc = self.model.config
        self.tokenizer = Tokenizer(self.model_path) if (self.model_path / "tokenizer.json").exists() else None
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        self.block_size = config.block_size
        bpb = KVPool.bytes_per_block(mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, act_dtype)
        min_blocks = -(-self.max_model_len // config.block_size)
        # Never allocate more than max_num_seqs full-length sequences could ever use.
        num_blocks = config.num_kv_blocks or max(
            1, min(config.kv_cache_memory_bytes // bpb, config.max_num_seqs * min_blocks)
        )
        if num_blocks < min_blocks:
            raise ValueError(
                f"KV pool of {num_blocks} blocks cannot hold one max_model_len={self.max_model_len} "
                f"sequence ({min_blocks} blocks); raise kv_cache_memory_bytes/num_kv_blocks or lower max_model_len"
            )
        self.kv_pool = KVPool(
            mc.num_layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, act_dtype, config.device
        )
        # prefault_kv: the pool's pages mapped in the background (the thread, to wait for it)
        self.kv_populate = self.kv_pool.populate_async() if config.prefault_kv else None
        self.return_routes = config.enable_return_routed_experts and mc.is_moe
        self.route_store = (
            RouteStore(config.block_size, mc.num_moe_layers, mc.top_k, mc.num_experts) if self.return_routes else None
        )
        on_evict = self.route_store.on_block_evicted if self.route_store is not None else None
        self.block_pool = BlockPool(num_blocks, on_evict=on_evict)
        self.provenance = Provenance(
            model_id=str(config.model),
            weights_version=model_digest(self.model),
            dtype=config.dtype,
            numerics=numerics_id(config, self.model),
            route_mode="free",
            cache_salt=config.cache_salt,
        )
        self.r3_clock = R3Clock()  # route-return bookkeeping time (the direct R3 overhead)
        self.kv_holds = BlockHolds(self.block_pool)  # references held by sessions and checkpoints
        self.kv_manager = KVCacheManager(
            self.block_pool, config.block_size, self.provenance, config.enable_prefix_caching, self.route_store,
            self.r3_clock, self.kv_holds,
        )
        self.scheduler = Scheduler(self.kv_manager, config.max_num_batched_tokens, config.max_num_seqs)
        self.runner = ModelRunner(self.model, self.kv_pool, config.device, self.return_routes, self.r3_clock)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.eos_token_ids = set(mc.eos_token_ids)
        self.pd: PDConnector | None = None
        self._wakeup = threading.Event()
        self.weight_update: WeightUpdate | None = None  # in progress (policy drain)
        self._weights_versions = {self.provenance.weights_version}  # every version this engine has run
        self._finished_between_steps: list[RequestOutput] = []  # final outputs the next step() returns
        self.startup_seconds = time.perf_counter() - t0

    def attach_pd(self, cfg: PDConfig) -> PDConnector:
        """Enable prefill/decode disaggregation in the given role (once)."""
        from execstate.engine.pd_connector import PDConnector  # NIXL loads only when PD is used

        if self.pd is not None:
            raise RuntimeError("a PD connector is already attached")
        self.pd = PDConnector(self, cfg)
        return self.pd

    def wake(self) -> None:
        """End an idle ``step()``'s wait now (thread-safe: a load finished, a command arrived)."""
        self._wakeup.set()

    # -- requests -------------------------------------------------------------
    def tokenize_prompt(self, prompt: PromptType) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json: pass {'prompt_token_ids': [...]}")
            return self.tokenizer.encode(prompt, max_model_len=self.max_model_len), prompt
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt")
            if "prompt" in prompt:
                return self.tokenize_prompt(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt_token_ids' or 'prompt'")
        if isinstance(prompt, list | tuple):
            return list(prompt), None
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}")

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        kv_transfer_params: dict[str, Any] | Handoff | None = None,
    ) -> str:
        """Queue one request. ``kv_transfer_params``: PD handoff parameters (a dict as a producer
        returned them, accepted only if signed or from an allow-listed producer, else ValueError),
        a ``Handoff`` the caller already verified, or ``{"do_remote_decode": True}`` (export)."""
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params.n != 1:
            raise ValueError("the engine takes n=1 requests; LLM.generate expands n > 1")
        validate_sampling(params, self.model_config.vocab_size)
        token_ids, text = self.tokenize_prompt(prompt)
        validate_prompt(token_ids, self.model_config.vocab_size, self.max_model_len)
        validate_logit_bias(params.logit_bias, self.model_config.vocab_size)
        cache_salt = cache_salt_of(prompt)
        mc = self.model_config
        if params.routed_experts is not None:
            forced = validate_forced_routes(
                params.routed_experts, mc.num_moe_layers if mc.is_moe else 0, mc.top_k or 0,
                mc.num_experts or 0, self.max_model_len - 1,
            )
            params = replace(params, routed_experts=forced)
        handoff = self._handoff(kv_transfer_params)
        req = Request(request_id, [int(t) for t in token_ids], params, self.max_model_len, prompt=text)
        if isinstance(kv_transfer_params, Handoff):
            req.handoff = kv_transfer_params
        else:
            req.kv_transfer_params = kv_transfer_params
            req.handoff = handoff
        req.cache_salt = cache_salt
        if self.return_routes or params.routed_experts is not None:
            capacity = len(token_ids) + req.max_new_tokens
            req.routes = RouteTrace(mc.num_moe_layers, mc.top_k, capacity) if self.return_routes else None
        req.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else self.generator
        req.penalty_state = PenaltyState.for_request(params, req.prompt_token_ids, req.output_token_ids, mc.vocab_size)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def add_step_request(self, step: StepRequest) -> Request:
        """Queue one session step (``engine/step_request.py``): validated first (ValueError,
        nothing changed); then its held blocks become the request's and come back at finish as
        ``Request.returned_blocks``. Returns the queued request."""
        req = build_step_request(self, step)
        if step.held is not None:
            held = self.kv_holds.hand_over(step.held)
            req.block_ids, req.block_keys = held.block_ids, held.block_keys
            req.num_committed_blocks, req.num_computed_tokens = held.num_committed_blocks, held.num_tokens
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        return req

    def _handoff(self, kv: dict[str, Any] | Handoff | None) -> Handoff | None:
        """The trusted handoff to load from, or None; ValueError when it may not be used."""
        if isinstance(kv, Handoff) or wants_remote_prefill(kv):
            if self.pd is None or not self.pd.is_consumer:
                raise ValueError("kv_transfer_params asks to load KV (do_remote_prefill) but this engine has no "
                                 "kv_consumer connector")
            if isinstance(kv, Handoff):
                return kv
            assert kv is not None
            return self.pd.accept_handoff(kv)
        return None

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        out = self._finalize(req)
        self._switch_weights_if_drained()
        return out

    def abort_request_deferred(self, request_id: str) -> bool:
        """Abort now, but let the next ``step()`` return the final output (for callers that are
        not the request's consumer, e.g. a session closed on the engine thread). False if unknown."""
        out = self.abort_request(request_id)
        if out is None:
            return False
        self._finished_between_steps.append(out)
        return True

    def poll(self) -> None:
        """Housekeeping that must also run while idle (PD: apply releases, expire exports;
        a drained weight update switches)."""
        if self.pd is not None:
            self.pd.poll()
        self._switch_weights_if_drained()

    @property
    def needs_polling(self) -> bool:
        return (self.pd is not None and self.pd.needs_polling) or self.weight_update is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished or bool(self._finished_between_steps)

    # -- one step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        state = StepState()
        try:
            return self._run_step(state)
        except Exception as exc:  # the step's requests fail; the engine goes on (step_failure)
            return fail_step(self, state, exc)

    def _run_step(self, state: StepState) -> list[RequestOutput]:
        self.poll()
        sched = state.sched = self.scheduler.schedule()
        if sched.block_copies:
            self.kv_pool.copy_blocks(sched.block_copies)
        outputs = state.outputs = self._finished_between_steps + [self._finalize(r) for r in sched.failed]
        self._finished_between_steps = []
        if sched.empty:
            if self.scheduler.has_unfinished and not outputs and not self._blocks_held_elsewhere():
                if not self.kv_holds.num_holders:
                    raise EngineFatalError("scheduler made no progress although requests are waiting")
                outputs += self._relieve_holds()
                return outputs
            if not outputs and self.scheduler.num_loading and not (self.pd and self.pd.has_finished_loads):
                # Nothing to run until a load finishes. A wake-up set before this wait ends it at once
                # (at worst one spurious extra step); one set after it returns is not needed: the
                # caller takes its commands and the next step polls the loads.
                self._wakeup.wait(_IDLE_WAIT_S)
                self._wakeup.clear()
            return outputs
        result = self.runner.execute(sched)
        if result.routes is not None:
            t_r3 = time.perf_counter()
            for s, off in zip(sched.scheduled, result.token_offsets, strict=True):
                if s.request.routes is not None:
                    s.request.routes.fill(s.num_computed_before, result.routes[off : off + s.num_new_tokens])
            self.r3_clock.add_since(t_r3)
        for s in sched.scheduled:
            self.scheduler.on_computed(s)
        if not result.sample_rows:
            return outputs
        reqs = [sched.scheduled[i].request for i in result.sample_rows]
        banned = [self._banned(r) for r in reqs]
        sampled = sample(result.logits, [r.params for r in reqs], [r.generator for r in reqs], banned,
                         [r.penalty_state for r in reqs])
        now = time.monotonic()
        for j, req in enumerate(reqs):
            req.output_token_ids.append(sampled.token_ids[j])
            req.output_logprobs.append(sampled.logprobs[j])
            req.output_top_logprobs.append(sampled.top_logprobs[j])
            if req.first_token_time is None:
                req.first_token_time = now
            status = on_new_token(req, self.eos_token_ids, self.tokenizer)
            if status is not None and self.pd is not None and self.pd.wants_export(req):
                status = self._export(req, status)
            if status is not None:
                self.scheduler.finish(req, status)
                outputs.append(self._finalize(req))
            elif req.params.output_kind is not RequestOutputKind.FINAL_ONLY:
                outputs.append(build_output(req, self.tokenizer, self.return_routes))
        return outputs

    def _blocks_held_elsewhere(self) -> bool:
        """True while blocks are held outside running requests (PD exports awaiting pickup,
        loads in flight, blocks fenced after an uncancellable read)."""
        pd = self.pd
        return self.scheduler.num_loading > 0 or (pd is not None and (
            pd.num_pinned_exports > 0 or bool(pd.fenced_blocks) or pd.num_loads_inflight > 0))

    def _relieve_holds(self) -> list[RequestOutput]:
        """Nothing runs and the waiting requests do not fit beside the blocks held by sessions and
        checkpoints: let the holds' owner reclaim (evict an idle session); if it cannot, fail the
        first waiting request (a request-level error) rather than wait forever."""
        if self.kv_holds.reclaim() or not self.scheduler.waiting:
            return []
        req = self.scheduler.waiting[0]
        pool = self.block_pool
        req.abort_message = (
            f"the request cannot be admitted: sessions and checkpoints hold {self.kv_holds.num_references} "
            f"block references ({pool.num_used} of {pool.num_blocks} blocks in use); close sessions or "
            "release checkpoints, or enable session eviction"
        )
        self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
        return [self._finalize(req)]

    def _export(self, req: Request, status: RequestStatus) -> RequestStatus:
        """Producer: hand the finished prefill's blocks to the decode side (before the
        request frees them). Over the transfer limits this is a request-level error."""
        assert self.pd is not None
        try:
            req.kv_transfer_out = self.pd.export(req)
        except TransferError as e:
            req.abort_message = f"KV export failed: {e}"
            return RequestStatus.FINISHED_ABORTED
        return status

    def _banned(self, req: Request) -> list[int]:
        if len(req.output_token_ids) >= req.params.min_tokens:
            return []
        return sorted(self.eos_token_ids | set(req.params.stop_token_ids or []))

    def _finalize(self, req: Request) -> RequestOutput:
        req.finish_time = time.monotonic()
        self.requests.pop(req.request_id, None)
        t_r3 = time.perf_counter()
        out = build_output(req, self.tokenizer, self.return_routes)
        if out.outputs[0].routed_experts is not None:
            self.r3_clock.add_since(t_r3)  # the output is built anyway; dominated by the routes array
        self._run_finish_hook(req, out)
        return out

    def _run_finish_hook(self, req: Request, out: RequestOutput) -> None:
        """``req.on_finished`` (a session taking its step's blocks back), once. If it raises, the
        blocks it did not take are released so that nothing leaks; the error is logged."""
        hook, req.on_finished = req.on_finished, None
        if hook is None:
            return
        try:
            hook(req, out)
        except Exception:  # noqa: BLE001 - a hook must not take the engine down
            logger.exception("the finish hook of request %s failed", req.request_id)
            held = req.returned_blocks
            if held is not None and self.kv_holds.holds(held):
                self.kv_holds.release(held)

    def check_integrity(self) -> None:
        self.block_pool.check_integrity()
        self.kv_holds.check_integrity()
        if self.route_store is not None:
            self.route_store.check_integrity()
