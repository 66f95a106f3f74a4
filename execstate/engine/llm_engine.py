"""The engine: requests in, one scheduled forward pass per ``step()``, outputs out.

Call order: ``add_request`` (validates; raises ValueError and changes nothing on bad
input) → ``step()`` repeatedly while ``has_unfinished_requests()`` → outputs. Every
request is finished exactly once (stop, length, abort), which releases its blocks and
route leases.

``LLMEngine`` builds its parts (``engine/engine_parts.py``) and wires them together as
collaborators, each given the parts it works on and never the engine (none imports this module):
``intake`` (prompts and session steps → validated requests), ``scheduler`` / ``kv_manager`` /
``runner`` (what runs, its KV blocks, the forward pass), ``results`` (``engine/step_results.py``:
sampling, stops, streaming), ``finisher`` (``engine/finisher.py``: the one place a request ends),
``weights`` (``engine/engine_weights.py``: weight updates in place, policies ``abort`` and
``drain``, rules in ``engine/weight_update.py``; the weights version is part of every block key,
so no cache reset is needed), ``failure`` (``engine/step_failure.py``: a step that raises fails
its own requests, finish_reason ``"abort"`` with ``error`` set, and the engine goes on; only when
shared state fails its checks afterwards does ``step`` raise ``EngineCorruptedError``) and ``pd``
(``engine/pd_connector.py``, from ``EngineConfig.kv_transfer``).

KV connectors (the anchor is vLLM v1's KV connector, with a scheduler role and a worker role):
the KV events (``state/kv_events/recorder.py``), the offload tiers (``engine/offload.py``: a pool side that
writes evicted blocks back and notes their origins, a scheduler side that reloads prompts) and the
PD connector (``engine/pd_connector.py``, from ``EngineConfig.kv_transfer``: its worker side
exports and loads blocks over NIXL, its scheduler side, ``loads``, is the scheduler's ``external``
source; ``make_importer`` / ``on_transfer``, the code it calls, are ``LLMEngine`` arguments). All
three are built in ``__init__`` before the parts that call them and given to those at
construction, in one order (see the comment there); the block pool calls its eviction hooks in
one documented order (``BlockPool``: write-back, route store, KV events). None is attached or
replaced afterwards.

PD decode side: a request whose KV is loaded from a prefill instance waits in its own state
while the others keep stepping. When every unfinished request is waiting for a load, ``step()``
blocks until a load finishes, ``wake()`` is called (any thread: the ``AsyncEngine`` calls it for
each command) or 50 ms pass.

Session steps (``add_step_request``, used by ``session/`` through ``SessionPort.add_step``): a
request that arrives holding the session's blocks (``HeldBlocks`` registered in ``kv_holds``) and
hands them back at finish (``on_finished``, run by the finisher on the engine thread before the
final output is returned).
Holds count in the failed-step reference check. When waiting requests cannot be admitted because
holds fill the pool (nothing running), the engine asks the holds' owner to reclaim (evict an idle
session); if it cannot, the first waiting request fails with an error saying why (never a hang).
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from execstate.engine.config import EngineConfig
from execstate.engine.cuda_graphs import DecodeGraphs
from execstate.engine.engine_parts import EngineParts
from execstate.engine.engine_weights import EngineWeights
from execstate.engine.finisher import RequestFinisher
from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.grammar_masks import GrammarMasks
from execstate.engine.intake import PromptType, RequestIntake
from execstate.engine.interactive_hold import InteractiveHold
from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.offload import OffloadConnector, build_offload
from execstate.engine.outputs import RequestOutput
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request, RequestStatus
from execstate.engine.runner import ModelRunner
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import Scheduler
from execstate.engine.session_step import StepRequest
from execstate.engine.step_failure import EngineFatalError, StepFailure, StepState, check_references
from execstate.engine.step_results import StepResults
from execstate.engine.step_trace import StepTrace
from execstate.engine.weight_update import UpdatePolicy, WeightUpdate
from execstate.identity.provenance import Provenance
from execstate.identity.scope import CacheScope
from execstate.kernels import cpu as cpu_kernels
from execstate.kernels.team import team_governor
from execstate.model.step_timers import StepTimers
from execstate.state.block_holds import BlockHolds
from execstate.state.block_pool import BlockPool
from execstate.state.kv_events.recorder import KVEvents, build_kv_events
from execstate.transfer.errors import TransferError
from execstate.transfer.handoff import Handoff, wants_remote_prefill

if TYPE_CHECKING:
    from execstate.engine.pd_config import ImporterFactory, PDConfig, TransferObserver
    from execstate.engine.pd_connector import PDConnector

__all__ = ["LLMEngine", "PromptType"]

# Longest wait of an idle step (every unfinished request waiting for a KV load) without a wake-up.
_IDLE_WAIT_S = 0.05


class LLMEngine:
    def __init__(self, config: EngineConfig, *, make_importer: ImporterFactory | None = None,
                 on_transfer: TransferObserver | None = None) -> None:
        """``make_importer``: how the PD connector's importer is built (None: the real one; a
        fault-injecting one in tests and ``execstate bench pd``); ``on_transfer``: told of every
        finished PD load (a consumer's). Both matter only with ``config.kv_transfer``."""
        t0 = time.perf_counter()
        self.config = config
        parts = EngineParts.build(config)
        self.model_path: Path = parts.model_path
        self.model = parts.model
        self.model_config = mc = parts.model.config
        self.tokenizer = parts.tokenizer
        self.max_model_len = parts.max_model_len
        self.block_size = config.block_size
        self.kv_pool = parts.kv_pool
        self.kv_populate = parts.kv_populate  # prefault_kv: the thread mapping the pool's pages
        self.return_routes = parts.return_routes
        self.route_store = parts.route_store
        self._wakeup = threading.Event()
        # The connectors, built once in this order, each given to the parts that call it at their
        # construction (state/kv_events/recorder.py, engine/offload.py, engine/pd_connector.py): the
        # KV events (the pool's and the tiers' changes), the offload tiers' pool side (they report
        # to the KV events), then the block pool with its eviction hooks in their one order
        # (BlockPool: write-back, route store, KV events), the KV cache manager (commits reported to
        # the KV events, origins noted for the tiers), the PD connector (it pins and fills blocks of
        # the pool, keys them with the manager), the tiers' scheduler side, and the scheduler that
        # consults both (PD loads first, then the tiers); last, the weights, which tell the PD
        # connector of a switch.
        self.kv_events: KVEvents | None = build_kv_events(config, self)
        self.offload: OffloadConnector | None = build_offload(self)
        self.block_pool = BlockPool(
            parts.num_blocks, on_evict=self.route_store.on_block_evicted if self.route_store is not None else None,
            write_back=self.offload.write_back if self.offload is not None else None,
            evict_observer=self.kv_events.pool_removed if self.kv_events is not None else None,
        )
        self.r3_clock = R3Clock()  # route-return bookkeeping time (the direct R3 overhead)
        self.kv_holds = BlockHolds(self.block_pool)  # references held by sessions and checkpoints
        self.kv_manager = KVCacheManager(
            self.block_pool, config.block_size, parts.provenance, config.enable_prefix_caching, self.route_store,
            self.r3_clock, self.kv_holds, events=self.kv_events,
            pool_units=self.offload.units if self.offload is not None else None,
        )
        self.pd: PDConnector | None = self._build_pd(config.kv_transfer, make_importer, on_transfer)
        self.scheduler = Scheduler(self.kv_manager, config.max_num_batched_tokens, config.max_num_seqs,
                                   batch_budget=config.interactive_batch_budget,
                                   hold=InteractiveHold(config.interactive_hold_s),
                                   external=self.pd.loads if self.pd is not None else None,
                                   offload=self.offload.scheduler_role(self.kv_manager) if self.offload else None)
        # per-step time breakdown (EngineConfig.step_timers), or None
        self.step_timers = (StepTimers(cpu_kernels.max_threads() if cpu_kernels.available() else 1, config.step_timers)
                            if config.step_timers is not None else None)
        self.runner = ModelRunner(self.model, self.kv_pool, config.device, self.return_routes, self.r3_clock,
                                  config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len,
                                  config.use_triton(), self.step_timers,
                                  team_governor(config.kernel_team, self.model.kernels))
        if torch.device(config.device).type == "cuda" and not config.enforce_eager and not self.model.kernels:
            runner = self.runner.device_runner
            runner.graphs = DecodeGraphs.capture(runner, config.max_num_seqs)  # GPU-only (engine/cuda_graphs.py)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.eos_token_ids = set(mc.eos_token_ids)
        # Structured outputs (engine/grammar/): compiled constraints, and their masks per step.
        self.grammar = (GrammarCompiler(self.tokenizer.backend, mc.vocab_size, sorted(self.eos_token_ids))
                        if self.tokenizer is not None else None)
        self.grammar_masks = GrammarMasks(mc.vocab_size, self.eos_token_ids,
                                          defer_greedy=torch.device(config.device).type == "cpu")
        self.intake = RequestIntake(mc, self.max_model_len, self.tokenizer, self.return_routes, self.generator,
                                    self.kv_holds, self.grammar, config.prompt_logprobs_chunk_tokens)
        self.finisher = RequestFinisher(self.requests, self.tokenizer, self.return_routes, self.r3_clock,
                                        self.kv_holds)
        self.weights = EngineWeights(self.model, self.requests, self.scheduler, self.kv_manager, self.finisher,
                                     on_switch=(self.pd.on_weights_updated,) if self.pd is not None else ())
        self.results = StepResults(self.scheduler, self.finisher, self.tokenizer, self.eos_token_ids,
                                   self.return_routes, self.r3_clock, self._export)
        self.failure = StepFailure(self.scheduler, self.requests, self.finisher, self.check_shared_state)
        # per-step spans and the classes each served (engine/step_trace.py): set by a benchmark, or None
        self.step_trace: StepTrace | None = None
        self.startup_seconds = time.perf_counter() - t0

    @property
    def provenance(self) -> Provenance:
        """The provenance new blocks are keyed under (a weight update re-binds it)."""
        return self.kv_manager.provenance

    @property
    def weight_update(self) -> WeightUpdate | None:
        """The weight update in progress (policy drain), None when none is."""
        return self.weights.in_progress

    def _build_pd(self, cfg: PDConfig | None, make_importer: ImporterFactory | None,
                  on_transfer: TransferObserver | None) -> PDConnector | None:
        """The PD connector in ``cfg``'s role (``None`` without a config), given the parts it
        works on (``engine/pd_connector.py``)."""
        if cfg is None:
            return None
        from execstate.engine.pd_connector import PDConnector  # NIXL loads only when PD is used

        route_shape = (self.model_config.num_moe_layers, self.model_config.top_k) if self.return_routes else None
        return PDConnector(cfg, kv_pool=self.kv_pool, block_pool=self.block_pool, kv_manager=self.kv_manager,
                           route_shape=route_shape, wake=self.wake, make_importer=make_importer,
                           on_transfer=on_transfer)

    def wake(self) -> None:
        """End an idle ``step()``'s wait now (thread-safe: a load finished, a command arrived)."""
        self._wakeup.set()

    # -- requests -------------------------------------------------------------
    def tokenize_prompt(self, prompt: PromptType) -> tuple[list[int], str | None]:
        return self.intake.tokenize_prompt(prompt)

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        kv_transfer_params: dict[str, Any] | Handoff | None = None,
        scope: CacheScope | None = None,
    ) -> str:
        """Queue one request. ``kv_transfer_params``: PD handoff parameters (a dict as a producer
        returned them, accepted only if signed or from an allow-listed producer, else ValueError),
        a ``Handoff`` the caller already verified, or ``{"do_remote_decode": True}`` (export).
        ``scope``: who may share the request's cached state (``identity/scope.py``; default: the
        local tenant, with the salt of a prompt dict's ``cache_salt``, as vLLM's offline API)."""
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = self.intake.build(prompt, params, request_id, kv_transfer_params, self._handoff, scope)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def add_step_request(self, step: StepRequest) -> Request:
        """Queue one session step (``engine/step_request.py``): validated first (ValueError,
        nothing changed); then its held blocks become the request's and come back at finish in
        the ``FinishedStep`` its hook gets (``engine/session_step.py``). Returns the queued request."""
        req = self.intake.build_step(step, self.requests)
        if step.held is not None:
            held = self.kv_holds.hand_over(step.held)
            req.block_ids, req.cache.block_keys = held.block_ids, held.block_keys
            req.cache.num_committed_blocks, req.num_computed_tokens = held.num_committed_blocks, held.num_tokens
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
        out = self.finisher.finalize(req)
        self.weights.switch_if_drained()
        return out

    def abort_request_deferred(self, request_id: str) -> bool:
        """Abort now, but let the next ``step()`` return the final output (for callers that are
        not the request's consumer, e.g. a session closed on the engine thread). False if unknown."""
        out = self.abort_request(request_id)
        if out is None:
            return False
        self.finisher.defer(out)
        return True

    def poll(self) -> None:
        """Housekeeping that must also run while idle (PD: apply releases, expire exports;
        a drained weight update switches)."""
        if self.pd is not None:
            self.pd.poll()
        self.weights.switch_if_drained()

    @property
    def needs_polling(self) -> bool:
        return (self.pd is not None and self.pd.needs_polling) or self.weights.in_progress is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished or self.finisher.has_deferred

    # -- weights ------------------------------------------------------------------
    def update_weights(
        self, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> list[RequestOutput]:
        """Load new weights in place (``source``: a state dict with HF tensor names, or a
        checkpoint directory) and return the final outputs of the requests in flight:
        aborted (``policy="abort"``) or completed on the old weights (``"drain"``, which
        steps the engine until they finish). ``weights_version``: see ``begin_weight_update``.
        """
        update = self.begin_weight_update(source, weights_version, policy)
        outputs = list(update.aborted)
        while not update.done:
            outputs += [o for o in self.step() if o.finished]
            self.poll()
        return outputs

    def begin_weight_update(
        self, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> WeightUpdate:
        """Start a weight update (rules: ``engine/weight_update.py``); complete when the
        returned update is ``done``: at once for ``abort`` (outputs in ``update.aborted``),
        for ``drain`` once the requests in flight finish (``step``/``poll`` switch; the
        state dict's tensors are read then: leave them unchanged until ``done``). A
        ``ValueError`` (policy, version, any tensor's name/dtype/shape) changes nothing."""
        update = self.weights.begin(source, weights_version, policy)
        self.weights.switch_if_drained()
        return update

    # -- one step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        state = StepState()
        trace = self.step_trace
        if trace is not None:
            trace.begin()
        try:
            return self._run_step(state)
        except Exception as exc:  # the step's requests fail; the engine goes on (step_failure)
            return self.failure.fail(state, exc)
        finally:
            if self.kv_events is not None:
                self.kv_events.flush()  # this step's cache changes, one batch
            if trace is not None:
                trace.end(state.sched.scheduled if state.sched is not None else ())

    def _run_step(self, state: StepState) -> list[RequestOutput]:
        timers = self.step_timers
        if timers is not None:
            timers.begin_step()
        t0 = timers.now() if timers is not None else 0.0
        self.poll()
        sched = state.sched = self.scheduler.schedule()
        if sched.block_copies:
            self.kv_pool.copy_blocks(sched.block_copies)
        failed = [self.finisher.finalize(r) for r in sched.failed]
        outputs = state.outputs = self.finisher.take_deferred() + failed
        if sched.empty:
            held = self.scheduler.hold_remaining()
            if held > 0.0 and not outputs:
                # batch work held back for an interactive step expected any moment (interactive_hold.py):
                # wait for it (its command wakes this) or for the hold's end, then step again
                self._wakeup.wait(held)
                self._wakeup.clear()
                return outputs
            if self.scheduler.has_unfinished and not outputs and not self.blocks_held_elsewhere():
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
        if timers is not None:
            timers.add("schedule", t0)
        pending = self.grammar_masks.start(sched)  # computed while the forward pass runs
        team = self.runner.team  # its mode holds for every kernel and torch op of the step, sampler included
        tokens = sum(s.num_new_tokens for s in sched.scheduled)  # above MAX_LINEAR_ROWS: the large steps' mode
        with team.step(pending.busy if pending is not None else None, tokens) if team is not None else nullcontext():
            try:
                result = self.runner.execute(sched)
            finally:  # never leave a matcher in use by the worker (also when the forward pass failed)
                masks = pending.wait() if pending is not None else None
            t0 = timers.now() if timers is not None else 0.0
            self.results.apply(sched, result, outputs, masks.mask if masks is not None else None,
                               masks.deferred if masks is not None else None)
        if timers is not None:
            timers.add("sample", t0)
            timers.end_step(len(sched.scheduled),
                            tuple(s.num_computed_before + s.num_new_tokens for s in sched.scheduled),
                            any(s.num_new_tokens > 1 for s in sched.scheduled))
        return outputs

    def blocks_held_elsewhere(self) -> bool:
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
        return [self.finisher.finalize(req)]

    def _export(self, req: Request, status: RequestStatus) -> RequestStatus:
        """Producer: hand a finishing prefill's blocks to the decode side (before the request
        frees them) when it asked for it. Over the transfer limits this is a request-level error."""
        if self.pd is None or not self.pd.wants_export(req):
            return status
        try:
            req.transfer.out = self.pd.export(req)
        except TransferError as e:
            req.abort_message = f"KV export failed: {e}"
            return RequestStatus.FINISHED_ABORTED
        return status

    # -- checks -------------------------------------------------------------------
    def check_integrity(self) -> None:
        self.block_pool.check_integrity()
        self.kv_holds.check_integrity()
        if self.route_store is not None:
            self.route_store.check_integrity()
        if self.offload is not None:
            self.offload.check_integrity()

    def check_shared_state(self) -> None:
        """``check_integrity`` and every block reference accounted for (``step_failure.check_references``)."""
        self.check_integrity()
        check_references(self)
