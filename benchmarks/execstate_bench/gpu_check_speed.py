"""The device check's speed part: the standard model's decode and prefill on the torch path beside
transformers' ``generate`` on the same device, GPU utilisation, and roofline shares.

Workload (per dtype, bf16 then fp32): ``b`` requests of a 32-token prompt decoding 64 tokens
(b = 1, 8, 64; ``--cpu``: 1, 2 on a tiny model): decode tok/s = b x steps / wall time of the
decode steps, and the step time; prefill = 8 requests of 256 tokens in one step (``--cpu``: 2 x 16);
the deterministic mode's decode at b = 8. transformers: ``generate`` with a static cache, greedy,
the same prompts and lengths, eager, then compiled (``torch.compile``, mode ``reduce-overhead``) at
b = 64 when at least two minutes are left. HBM share: the bytes a decode step must read (every
weight once: at b >= 8 nearly every expert is routed to; the KV of every sequence) at the measured
copy bandwidth, over the measured step time. Prefill share: 2 x active parameters x tokens FLOPs
per second over the measured bf16 matmul rate.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.model.random_models import make_random, make_standard_moe
from execstate_bench.gpu_check_parts import Clock, environment, gpu_kwargs, sync

PROMPT, NEW = 32, 64


def speed(work: Path, device: str, clock: Clock, cpu: bool) -> dict[str, Any]:
    path = make_random("qwen3_moe", work / "tiny", seed=0) if cpu else make_standard_moe(work / "standard", seed=0)
    env = environment(device)
    batches = (1, 2) if cpu else (1, 8, 64)
    out: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        rows: dict[str, Any] = {}
        engine = LLMEngine(EngineConfig(model=path, device=device, dtype=dtype, max_num_seqs=max(batches),
                                        **gpu_kwargs(device)))
        for b in batches:
            if clock.left() < 30:
                rows[f"decode b={b}"] = "skipped: out of time"
                continue
            util = _Utilisation(device) if b == max(batches) else None
            rows[f"decode b={b}"] = _decode(engine, b, device, util)
        n, length = (2, 16) if cpu else (8, 256)
        rows[f"prefill {n}x{length}"] = _prefill(engine, n, length, device, env, _active_params(engine))
        rows["roofline"] = _roofline(engine, rows, batches, env)
        rows["graphs"] = engine.runner.device_runner.graphs is not None
        del engine
        if dtype == "bfloat16" and clock.left() > 60:
            det = LLMEngine(EngineConfig(model=path, device=device, dtype=dtype, deterministic=True, max_num_seqs=8,
                                         kernels="torch", gpu_kernels="triton"))
            rows["deterministic decode b=8"] = _decode(det, min(8, max(batches)), device, None)
            del det
        if clock.left() > 45:
            rows["transformers"] = _transformers(path, dtype, batches, device, clock)
        out[dtype] = rows
    return out


def _decode(engine: LLMEngine, b: int, device: str, util: _Utilisation | None) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    for p in np.random.default_rng(b).integers(3, 500, (b, PROMPT)).tolist():
        engine.add_request(p, params)
    engine.step()  # prefill
    engine.step()  # first decode: warm-up
    sync(device)
    steps, t0 = 0, time.perf_counter()
    if util:
        util.start()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    sync(device)
    dt = time.perf_counter() - t0
    res: dict[str, Any] = {"tok_s": round(b * steps / dt, 1), "step_ms": round(1e3 * dt / steps, 3)}
    if util:
        res["gpu_util_pct"] = util.stop()
    return res


def _prefill(engine: LLMEngine, n: int, length: int, device: str, env: dict[str, Any],
             active: int) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=1)
    times = []
    for rep in range(3):  # the first is a warm-up
        for p in np.random.default_rng(100 + rep).integers(3, 500, (n, length)).tolist():
            engine.add_request(p, params)
        sync(device)
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    dt = float(np.median(times[1:]))
    res: dict[str, Any] = {"tok_s": round(n * length / dt, 1), "ms": round(1e3 * dt, 2)}
    if "bf16_tflops" in env:
        res["share_of_bf16_matmul_rate"] = round(2 * active * n * length / dt / 1e12 / env["bf16_tflops"], 3)
    return res


def _active_params(engine: LLMEngine) -> int:
    """Parameters one token multiplies by: all but the experts, plus top_k of every expert group."""
    cfg = engine.model_config
    total = sum(p.numel() for p in engine.model.parameters())
    experts = sum(p.numel() for n, p in engine.model.named_parameters() if "w_gate_up" in n or "w_down" in n)
    return int(total - experts + (experts * cfg.top_k // cfg.num_experts if cfg.is_moe else 0))


def _roofline(engine: LLMEngine, rows: dict[str, Any], batches: tuple[int, ...], env: dict[str, Any]) -> Any:
    if "copy_gbs" not in env:
        return "no bandwidth measured (CPU run)"
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    pool = engine.kv_pool
    per_token_kv = 2 * pool.num_layers * pool.k[0, 0].numel() * pool.k.element_size()
    res = {}
    for b in batches:
        r = rows.get(f"decode b={b}")
        if isinstance(r, dict):
            floor_s = (weight_bytes + b * (PROMPT + NEW // 2) * per_token_kv) / (env["copy_gbs"] * 1e9)
            res[f"b={b} hbm_share"] = round(floor_s * 1e3 / r["step_ms"], 3)
    return res


def _transformers(path: Path, dtype: str, batches: tuple[int, ...], device: str, clock: Clock) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    # transformers types PreTrainedModel.to through a decorator that mypy reads as unbound
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()  # type: ignore[arg-type]
    res: dict[str, Any] = {}

    def run(b: int) -> float:
        ids = torch.tensor(np.random.default_rng(b).integers(3, 500, (b, PROMPT)), device=device)
        with torch.no_grad():
            t0 = time.perf_counter()
            hf.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache_implementation="static")
            sync(device)
        return time.perf_counter() - t0

    for b in batches:
        if clock.left() < 30:
            break
        run(b)  # warm-up
        res[f"generate b={b} tok_s"] = round(b * NEW / run(b), 1)
    if device == "cuda" and clock.left() > 120:
        b = max(batches)
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
        run(b)
        run(b)  # compile and capture
        res[f"generate compiled b={b} tok_s"] = round(b * NEW / run(b), 1)
    return res


class _Utilisation:
    """Samples ``torch.cuda.utilization()`` every 100 ms between ``start`` and ``stop`` (mean %)."""

    def __init__(self, device: str) -> None:
        self.device, self._stop = device, threading.Event()
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        if self.device == "cuda":
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.samples.append(torch.cuda.utilization())
            except Exception:  # noqa: BLE001 - no NVML: no figure
                return

    def stop(self) -> float | str:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return round(float(np.mean(self.samples)), 1) if self.samples else "not measured"
