"""The parts of the device check (``execstate_bench/gpu_check.py``): environment, correctness, replay, host
round-trips and speed. Each returns a JSON-able dict; ``Clock.run`` turns an exception into an
``{"error": ...}`` entry so one failing part never hides the others' figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.kernels.family import kernel_family, triton_available, triton_runs_on
from execstate.model.random_models import make_random
from execstate.session.lm.llm import LLM
from execstate_bench.host_syncs import HostSyncCounter

FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
NEAR_TIE = 1e-3  # a greedy divergence whose top-2 logprob gap (CPU) is below this is a near-tie


class Clock:
    """A time budget shared by the parts; ``spent`` records each part's seconds."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s
        self.spent: dict[str, float] = {}

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.left() <= 0:
            return {"skipped": "out of time"}
        t0 = time.monotonic()
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported, the other parts go on
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.spent[name] = time.monotonic() - t0


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": device,
                           "triton": _triton_version(), "kernel_family": kernel_family(device)}
    if device != "cuda":
        env["device_name"] = "cpu"
        return env
    env["device_name"] = torch.cuda.get_device_name()
    n = 1 << 30  # 1 GiB copy, bytes read + written
    a, b = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    env["copy_gbs"] = round(2 * n / median_time(lambda: b.copy_(a), device) / 1e9, 1)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    env["bf16_tflops"] = round(2 * 8192**3 / median_time(lambda: x @ x, device) / 1e12, 1)
    return env


def _triton_version() -> str | None:
    if not triton_available():
        return None
    import triton

    return triton.__version__


def median_time(fn: Callable[[], Any], device: str, reps: int = 10) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, length).tolist() for _ in range(n)]


def gpu_kwargs(device: str) -> dict[str, Any]:
    """The torch path's kernels on ``device``: Triton where it runs (the interpreter on --cpu)."""
    return {"kernels": "torch", "gpu_kernels": "triton" if triton_runs_on(device) else "torch"}


def correctness(arch: str, work: Path, device: str) -> dict[str, Any]:
    path = make_random(arch, work / arch, seed=0)
    prompts = _prompts(3, 20)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    runs = {}
    for name, dev in (("gpu", device), ("cpu", "cpu")):
        llm = LLM(str(path), device=dev, enable_return_routed_experts=True, **(gpu_kwargs(dev) if dev == device
                                                                               else {"kernels": "torch"}))
        outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                                                   use_tqdm=False)]
        runs[name] = (llm, outs)
    gpu_llm, gpu = runs["gpu"]
    _, cpu = runs["cpu"]
    res: dict[str, Any] = {"tokens_vs_cpu": [_compare(g, c) for g, c in zip(gpu, cpu, strict=True)],
                           "routes_vs_cpu_rows_equal": [float(np.mean(np.all(g.routed_experts == c.routed_experts,
                                                                             axis=(1, 2))))
                                                        for g, c in zip(gpu, cpu, strict=True)]}
    res["tokens_vs_hf"] = _vs_transformers(path, prompts, gpu, device)
    hit_prompt = prompts[0] + gpu[0].token_ids + [7, 8, 9]
    hit = gpu_llm.generate({"prompt_token_ids": hit_prompt}, greedy, use_tqdm=False)[0]
    shared = len(prompts[0]) + len(gpu[0].token_ids) - 1
    hit_routes, cold_routes = hit.outputs[0].routed_experts, gpu[0].routed_experts
    assert hit_routes is not None and cold_routes is not None  # the engine returns routes
    res["prefix_hit"] = {"cached_tokens": hit.num_cached_tokens, "routes_equal_cold": bool(np.array_equal(
        hit_routes[:shared], cold_routes[:shared]))}
    return res


def _compare(a: Any, b: Any) -> str:
    """'equal', or where greedy tokens diverge and whether it is a near-tie on ``b`` (the CPU)."""
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)):
        if x != y:
            top = sorted((lp.logprob for lp in b.logprobs[i].values()), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else float("inf")
            return f"diverge at {i} ({'near-tie' if gap < NEAR_TIE else 'NOT a near-tie'}, gap {gap:.2e})"
    return "equal"


def _vs_transformers(path: Path, prompts: list[list[int]], outs: list[Any], device: str) -> list[str]:
    from transformers import AutoModelForCausalLM

    # transformers types PreTrainedModel.to through a decorator that mypy reads as unbound
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()  # type: ignore[arg-type]
    res = []
    with torch.no_grad():
        for p, o in zip(prompts, outs, strict=True):
            gen = hf.generate(torch.tensor([p], device=device), max_new_tokens=len(o.token_ids), do_sample=False,
                              min_new_tokens=len(o.token_ids))
            got = gen[0, len(p):].tolist()
            res.append("equal" if got == o.token_ids else f"diverge at {next(i for i, (a, b) in enumerate(zip(got, o.token_ids, strict=True)) if a != b)}")  # noqa: E501
    return res


def replay(work: Path, device: str) -> dict[str, Any]:
    path = make_random("qwen3_moe", work / "qwen3_moe", seed=0)
    llm = LLM(str(path), device=device, kernels="torch", gpu_kernels="triton", deterministic=True,
              enable_return_routed_experts=True, max_num_batched_tokens=24)
    prompts = _prompts(3, 17, seed=1)
    params = [SamplingParams(temperature=t, seed=s, max_tokens=6, ignore_eos=True, logprobs=0)
              for t, s in ((0.0, None), (0.9, 5), (0.9, 6))]
    bitwise = []
    for p, o in zip(prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False),
                    strict=True):
        out = o.outputs[0]
        assert out.logprobs is not None  # asked for
        scored = llm.score(p + out.token_ids, routed_experts=out.routed_experts)
        want = np.array([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True)])
        bitwise.append(bool(np.array(scored.logprobs[len(p) - 1:]).tobytes() == want.tobytes()))
    return {"bitwise": bitwise}


def host_syncs(work: Path, device: str) -> dict[str, Any]:
    path = make_random("qwen3_moe", work / "qwen3_moe", seed=0)
    engine = LLMEngine(EngineConfig(model=path, device=device, enable_return_routed_experts=True,
                                    **gpu_kwargs(device)))
    for i, p in enumerate(_prompts(4, 12)):
        engine.add_request(p, SamplingParams(temperature=0.8 if i % 2 else 0.0, seed=i, max_tokens=6, ignore_eos=True))
    engine.step()
    with HostSyncCounter() as count:
        engine.step()
    return {"reads": count.reads, "uploads": count.uploads, "events": count.events,
            "cuda_graphs": engine.runner.device_runner.graphs is not None}

