"""The torch path's forward pass: a step that never waits on the host until its sampled ids.

``DeviceRunner.execute(sched)`` is ``ModelRunner.execute`` for a model on torch ops (any device;
the C-kernel CPU path keeps ``ModelRunner``'s own code):

1. the step's inputs are staged into persistent buffers and copied without blocking
   (``engine/device_inputs.py``); forced routes (replay) go up the same way (``model/device/upload.py``);
2. the model runs with the paged attention backend over device-side tables
   (``model/device/attention.py``) and MoE dispatch on the device (``model/device/moe_dispatch.py``);
   a decode-only step whose batch fits a captured CUDA graph replays it (``engine/cuda_graphs.py``);
3. logits are computed on the device for the sampling rows only and stay there: the sampler
   (``engine/sampler.py``) runs on the device and its one read of the sampled ids is the step's
   one device-to-host synchronisation;
4. the captured routes are copied into a pinned host buffer without blocking (``routes`` is a
   numpy view of it), valid once the step has synchronised: ``RunnerOutput.wait`` (a no-op after
   the sampled ids were read, the one sync of a step that samples nothing).

The host round-trips of a step are counted by the benchmarks' ``execstate_bench/host_syncs.py``
(tests/gpu/test_host_syncs.py).
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import torch

from execstate.engine.device_inputs import DeviceInputs, StepInputs
from execstate.engine.prompt_logprobs import prompt_spans, score_rows
from execstate.engine.r3_clock import R3Clock
from execstate.engine.runner_output import RunnerOutput, hidden_rows
from execstate.engine.scheduler import SchedulerOutput
from execstate.model.context import RouteCapture, StepContext
from execstate.model.device.attention import DevicePagedAttention
from execstate.model.device.upload import upload
from execstate.model.transformer import CausalLM
from execstate.state.kv_pool import KVPool


class GraphReplay(Protocol):
    """What the runner asks of its CUDA graphs (``engine/cuda_graphs.DecodeGraphs``)."""

    def accepts(self, sched: SchedulerOutput) -> bool: ...

    def run(self, sched: SchedulerOutput) -> RunnerOutput: ...


class DeviceRunner:
    """Runs steps of a torch-ops model (module docstring). ``triton``: the Triton kernels run
    (attention, MoE); ``graphs``: the CUDA graph pool for decode steps, or None (eager)."""

    def __init__(self, model: CausalLM, kv_pool: KVPool, device: torch.device, capture_routes: bool,
                 r3_clock: R3Clock, max_tokens: int, max_seqs: int, max_model_len: int, triton: bool) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.device = device
        self.capture_routes = capture_routes
        self.r3_clock = r3_clock
        self.triton = triton
        cfg = model.config
        self.num_moe_layers = cfg.num_moe_layers if cfg.is_moe else 0
        self.top_k = cfg.top_k if cfg.is_moe else 0
        bs = kv_pool.block_size
        self.inputs = DeviceInputs(device, bs, max_tokens, max_seqs, -(-max_model_len // bs))
        self._route_host: torch.Tensor | None = None
        self._route_np: np.ndarray | None = None
        self.graphs: GraphReplay | None = None  # engine/cuda_graphs.DecodeGraphs (CUDA only), set by the engine

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        graphs = self.graphs
        if graphs is not None and graphs.accepts(sched) and not any(s.request.params.return_hidden
                                                                    for s in sched.scheduled):
            return graphs.run(sched)
        inp = self.inputs.load(sched)
        t_r3 = time.perf_counter()
        routes = self._capture(sched, inp)
        if self.capture_routes:
            self.r3_clock.add_since(t_r3)
        attention = DevicePagedAttention(self.kv_pool, inp.tables, self.triton)
        with StepContext(inp.positions, attention, routes) as ctx:
            hidden = self.model(inp.ids, ctx)
        rows_h = None
        if inp.sample_rows:
            rows_h = hidden.index_select(0, inp.logit_rows)
            logits = self.model.compute_logits(rows_h)
        else:
            logits = torch.empty((0, 0), device=self.device)
        # prompt logprobs (engine/prompt_logprobs.py): a step that scores a prompt reads its rows back
        # (a host sync per block of rows; steps without such a request are untouched)
        scored = score_rows(self.model, hidden, prompt_spans(sched.scheduled, inp.offsets))
        route_np = None
        if routes is not None and self.capture_routes:
            t_r3 = time.perf_counter()
            route_np = self._routes_to_host(routes.ids)
            self.r3_clock.add_since(t_r3)
        return RunnerOutput(logits, inp.sample_rows, route_np, inp.offsets, _done_event(self.device), device_step=True,
                            prompt_rows=scored, hidden=hidden_rows(rows_h, sched.scheduled, inp.sample_rows))

    def _capture(self, sched: SchedulerOutput, inp: StepInputs) -> RouteCapture | None:
        forced_rows = []
        for s, off in zip(sched.scheduled, inp.offsets, strict=True):
            forced = s.request.params.routed_experts
            start = s.num_computed_before
            if forced is not None and start < len(forced):
                forced_rows.append((off, forced[start : min(start + s.num_new_tokens, len(forced))]))
        if not (self.capture_routes or forced_rows):
            return None
        forced_ids = forced_mask = None
        if forced_rows:
            ids = np.zeros((inp.num_tokens, self.num_moe_layers, self.top_k), dtype=np.int64)
            mask = np.zeros(inp.num_tokens, dtype=np.bool_)
            for start, rows in forced_rows:
                ids[start : start + len(rows)] = rows
                mask[start : start + len(rows)] = True
            forced_ids, forced_mask = upload(ids, self.device), upload(mask, self.device)
        return RouteCapture(inp.num_tokens, self.num_moe_layers, self.top_k, forced_ids, forced_mask,
                            device=self.device)

    def _routes_to_host(self, ids: torch.Tensor) -> np.ndarray:
        """``ids`` (int16 ``[T, layers, k]`` on the device) copied without blocking into the pinned
        route buffer; returns the numpy view (valid after the step's sync)."""
        n = ids.shape[0]
        if self._route_host is None or self._route_host.shape[0] < n:
            self._route_host = torch.empty((max(n, self.inputs.max_tokens), *ids.shape[1:]), dtype=torch.int16,
                                           pin_memory=self.device.type == "cuda")
            self._route_np = self._route_host.numpy()
        assert self._route_np is not None
        self._route_host[:n].copy_(ids, non_blocking=True)
        return self._route_np[:n]


def _done_event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded after the step's work on a CUDA device (``RunnerOutput.wait``), else None."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event
