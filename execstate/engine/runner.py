"""Turns a scheduler step into one forward pass over a flat token batch.

The runner owns the model and the KV pool. For each step it builds the inputs
(token ids, positions, per-request spans over the block tables, forced routes of
replaying requests), runs the model inside a fresh ``StepContext``, computes logits
only for the rows that sample, and returns the captured routes as numpy.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from execstate.engine.device_runner import DeviceRunner
from execstate.engine.prompt_logprobs import prompt_spans, score_rows
from execstate.engine.r3_clock import R3Clock
from execstate.engine.runner_output import RunnerOutput, hidden_rows
from execstate.engine.scheduler import SchedulerOutput
from execstate.kernels.team import TeamGovernor
from execstate.model.context import RouteCapture, StepContext
from execstate.model.paged_attention import PagedAttention, SeqSpan
from execstate.model.step_timers import StepTimers
from execstate.model.transformer import CausalLM
from execstate.state.kv_pool import KVPool

__all__ = ["ModelRunner", "RunnerOutput"]


class ModelRunner:
    """``execute(sched)``: one forward pass. A model on execstate's CPU kernels runs here (host-built
    tables for the C kernels); a model on torch ops runs in ``DeviceRunner`` (any device: persistent
    device inputs, no host read before the sampled ids; ``engine/device_runner.py``).
    ``max_tokens``/``max_seqs``/``max_model_len`` size the device runner's buffers; ``triton``: it
    runs the Triton kernels; ``timers``: the per-step breakdown (``EngineConfig.step_timers``);
    ``team``: the kernels' thread governor (``EngineConfig.kernel_team``)."""

    def __init__(self, model: CausalLM, kv_pool: KVPool, device: torch.device | str, capture_routes: bool,
                 r3_clock: R3Clock | None = None, max_tokens: int = 2048, max_seqs: int = 64,
                 max_model_len: int = 2048, triton: bool = False, timers: StepTimers | None = None,
                 team: TeamGovernor | None = None):
        self.model = model
        self.timers = timers  # per-step time breakdown (EngineConfig.step_timers), or None
        # the kernels' team size, layer call by layer call (EngineConfig.kernel_team), or None; the
        # engine holds its step() around the whole step
        self.team = team
        self.r3_clock = r3_clock or R3Clock()
        self.kv_pool = kv_pool
        self.device = torch.device(device)
        cfg = model.config
        self.capture_routes = capture_routes and cfg.is_moe
        self.num_moe_layers = cfg.num_moe_layers if cfg.is_moe else 0
        self.top_k = cfg.top_k if cfg.is_moe else 0
        self.device_runner = DeviceRunner(model, kv_pool, self.device, self.capture_routes, self.r3_clock,
                                          max_tokens, max_seqs, max_model_len, triton)

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        if not self.model.kernels:
            return self.device_runner.execute(sched)
        return self._execute_kernels(sched)

    @torch.inference_mode()
    def _execute_kernels(self, sched: SchedulerOutput) -> RunnerOutput:
        """The step's forward pass and logits on the kernels (inside the engine's ``TeamGovernor.step``
        when it has one)."""
        timers = self.timers
        t0 = timers.now() if timers is not None else 0.0
        input_ids: list[int] = []
        positions: list[int] = []
        spans: list[SeqSpan] = []
        offsets: list[int] = []
        forced_rows: list[tuple[int, np.ndarray]] = []  # (flat start, rows)
        for s in sched.scheduled:
            req = s.request
            start, end = s.num_computed_before, s.num_computed_before + s.num_new_tokens
            offsets.append(len(input_ids))
            forced = req.params.routed_experts
            if forced is not None and start < len(forced):
                forced_rows.append((len(input_ids), forced[start : min(end, len(forced))]))
            spans.append(SeqSpan(len(input_ids), s.num_new_tokens, end, req.block_ids.array()))
            input_ids.extend(req.all_token_ids[start:end])  # the span it runs: O(new tokens), not O(context)
            positions.extend(range(start, end))
        num_tokens = len(input_ids)
        ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        routes = None
        t_r3 = time.perf_counter()
        if self.capture_routes or forced_rows:
            forced_ids, forced_mask = self._forced(num_tokens, forced_rows)
            routes = RouteCapture(
                num_tokens, self.num_moe_layers, self.top_k, forced_ids, forced_mask, device=self.device
            )
        if self.capture_routes:
            self.r3_clock.add_since(t_r3)
        attention = PagedAttention(self.kv_pool, spans, self.device, use_kernels=self.model.kernels)
        if timers is not None:
            timers.add("inputs", t0)
        with StepContext(pos_t, attention, routes, timers, self.team) as ctx:
            hidden = self.model(ids_t, ctx)
        t0 = timers.now() if timers is not None else 0.0
        sample_rows = [i for i, s in enumerate(sched.scheduled) if s.samples]
        last = [offsets[i] + sched.scheduled[i].num_new_tokens - 1 for i in sample_rows]
        rows_h = None
        if last:
            rows_h = hidden[torch.tensor(last, device=self.device)]
            logits = self.model.compute_logits(rows_h)
        else:
            logits = torch.empty((0, 0))
        if timers is not None:
            timers.add("lm_head", t0)
        scored = score_rows(self.model, hidden, prompt_spans(sched.scheduled, offsets))
        route_np = None
        if routes is not None and self.capture_routes:
            t_r3 = time.perf_counter()
            route_np = routes.host_ids()
            self.r3_clock.add_since(t_r3)
        return RunnerOutput(logits.float().cpu(), sample_rows, route_np, offsets, prompt_rows=scored,
                            hidden=hidden_rows(rows_h, sched.scheduled, sample_rows))

    def _forced(
        self, num_tokens: int, forced_rows: list[tuple[int, np.ndarray]]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not forced_rows:
            return None, None
        ids = torch.zeros((num_tokens, self.num_moe_layers, self.top_k), dtype=torch.long)
        mask = torch.zeros(num_tokens, dtype=torch.bool)
        for start, rows in forced_rows:
            ids[start : start + len(rows)] = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            mask[start : start + len(rows)] = True
        return ids.to(self.device), mask.to(self.device)
