"""CUDA graphs for decode steps (GPU-only: never run without a CUDA device).

A decode step of ``b`` sequences launches the same kernels every time; replaying a captured
graph removes the host's launch cost (hundreds of launches per step). ``DecodeGraphs.capture``
records one graph per batch size bucket (1, 2, 4, 8, then multiples of 8 up to ``max_seqs``)
after a warm-up (which compiles the Triton kernels), each reading the persistent input buffers
(``engine/device_inputs.py``) at fixed addresses and writing logits (and the routes) into static
outputs. A decode step of ``n`` sequences replays the smallest bucket ``b >= n``: its inputs are
loaded padded to ``b`` rows (pad rows repeat row 0's K/V slot, ``model/device/attention.py``) and
the first ``n`` rows of the outputs are used. Everything else runs eagerly: prefills and mixed
steps, steps with forced routes (replay), batches above the largest bucket, and every step once
the input buffers were reallocated (the graphs read the old ones).

Graphs need the Triton attention kernel (the torch fallback sizes its gather from the step's
longest context on the host). A capture that fails leaves the engine eager (``capture`` returns
None and says why in the log). The engine captures at start-up on a CUDA device unless
``enforce_eager``. Checked by ``scripts/gpu_check.sh`` only: CI has no GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from execstate.engine.device_runner import DeviceRunner
from execstate.engine.runner_result import StepResult
from execstate.engine.scheduler import SchedulerOutput
from execstate.model.context import RouteCapture, StepContext
from execstate.model.device.attention import DevicePagedAttention, Span, StepTables

log = logging.getLogger(__name__)


def buckets(max_seqs: int) -> list[int]:
    """Batch sizes graphs are captured at: 1, 2, 4, 8, then multiples of 8, up to ``max_seqs``."""
    sizes = [b for b in (1, 2, 4) if b < max_seqs] + list(range(8, max_seqs + 8, 8))
    return sorted({min(b, max_seqs) for b in sizes})


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [b, vocab] fp32, static
    routes: torch.Tensor | None  # int16 [b, layers, k], static


class DecodeGraphs:
    """The captured graphs of one ``DeviceRunner`` (module docstring)."""

    def __init__(self, runner: DeviceRunner, graphs: dict[int, _Graph], generation: int) -> None:
        self.runner = runner
        self.graphs = graphs
        self.generation = generation

    @classmethod
    def capture(cls, runner: DeviceRunner, max_seqs: int) -> DecodeGraphs | None:
        """Capture every bucket up to ``max_seqs`` (largest first: the smaller ones reuse its memory
        pool). None, with a warning, if this runner cannot use graphs or a capture fails."""
        if runner.device.type != "cuda" or not runner.triton:
            log.warning("CUDA graphs off: they need a CUDA device and the Triton kernels")
            return None
        pool = torch.cuda.graph_pool_handle()
        graphs: dict[int, _Graph] = {}
        try:
            for b in sorted(buckets(max_seqs), reverse=True):
                graphs[b] = _capture_one(runner, b, pool)
        except Exception as exc:  # noqa: BLE001 - a capture that fails leaves the engine eager
            log.warning("CUDA graph capture failed, decode steps run eagerly: %s", exc)
            return None
        finally:
            runner.kv_pool.k[:, 0].zero_()  # captures wrote pad K/V into slot 0: unused slots hold zeros
            runner.kv_pool.v[:, 0].zero_()
        return cls(runner, graphs, runner.inputs.generation)

    def accepts(self, sched: SchedulerOutput) -> bool:
        """Whether ``sched`` replays a graph: decode-only, no forced routes, within the largest bucket,
        input buffers unchanged since capture."""
        n = len(sched.scheduled)
        return (0 < n <= max(self.graphs) and self.runner.inputs.generation == self.generation
                and all(s.num_new_tokens == 1 and s.samples and s.request.params.routed_experts is None
                        for s in sched.scheduled))

    def run(self, sched: SchedulerOutput) -> StepResult:
        n = len(sched.scheduled)
        b = min(k for k in self.graphs if k >= n)
        g = self.graphs[b]
        inp = self.runner.inputs.load(sched, pad_to=b)
        g.graph.replay()
        route_np = None
        if g.routes is not None:
            route_np = self.runner._routes_to_host(g.routes[:n])
        return StepResult(g.logits[:n], inp.sample_rows, route_np, inp.offsets, _event(), device_step=True)


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event


def _tables(runner: DeviceRunner, b: int) -> StepTables:
    """The device buffers of a ``b``-row decode, at the addresses every replay loads into."""
    dev = runner.inputs.dev
    spans = tuple(Span(i, 1, 1) for i in range(b))  # host spans: unused by the Triton kernel
    return StepTables(dev["token_seq"][:b], dev["positions"][:b], dev["slots"][:b], dev["block_table"][:b],
                      dev["context_lens"][:b], runner.kv_pool.block_size, spans, dev["kv_rows"][:b])


def _forward(runner: DeviceRunner, b: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    tables = _tables(runner, b)
    routes = (RouteCapture(b, runner.num_moe_layers, runner.top_k, device=runner.device)
              if runner.capture_routes else None)
    with StepContext(tables.positions, DevicePagedAttention(runner.kv_pool, tables, True), routes) as ctx:
        hidden = runner.model(runner.inputs.dev["ids"][:b], ctx)
    logits = runner.model.compute_logits(hidden)
    return logits, (routes.ids if routes is not None else None)


@torch.inference_mode()
def _capture_one(runner: DeviceRunner, b: int, pool: tuple[int, int]) -> _Graph:
    dev = runner.inputs.dev
    for name in ("ids", "positions", "token_seq", "slots", "kv_rows"):  # a pad-only batch: slot 0 of block 0
        dev[name][:b].zero_()
    dev["context_lens"][:b].fill_(1)
    dev["block_table"][:b].zero_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: Triton compiles, the allocator settles
            _forward(runner, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits, routes = _forward(runner, b)
    return _Graph(graph, logits, routes)
