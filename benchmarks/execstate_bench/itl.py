"""ITL at 100 vs 8,000 generated tokens: is the per-token cost O(1) in the output length?

Two measurements, each once per output kind, with ``logprobs`` and a stop string that
never matches (so every token does the full per-token output work):

- **Output path** (no model): a request is fed ``max_tokens`` random tokens of the
  byte-level test tokenizer (``execstate.model.random_tokenizer``; random bytes split
  characters) through the engine's per-token path exactly as ``step()`` drives it
  (``on_new_token``, then ``build_output``: detokenisation, logprob entries, stop checks,
  the ``RequestOutput``). This is the cost docs/contracts.md 8 requires to be O(1) in the output
  length, without the noise of a model.
- **End to end**: one request, alone in the engine, generates ``max_tokens`` tokens on a
  tiny random Qwen3 (2 layers, hidden 64, ``max_position_embeddings`` raised to fit),
  seeded sampling, ``ignore_eos``. ITL is the wall time of each ``step()``; its CPU time
  is split into *forward* (``runner.execute``: input tensors and the model's forward;
  attention reads the whole context, so it grows with the length by nature), *output*
  (the output path above) and the rest of *host* (scheduling, sampling: no per-length
  work, but they run after attention has swept the whole KV through the CPU caches).

CPU times are the engine thread's (``time.thread_time``; torch runs single-threaded),
so other processes on a loaded machine inflate them less than wall times (but still do,
through shared caches). Reported: medians over the ``window`` tokens centred on token
100 and over the last ``window`` tokens, the smallest over ``repeats`` runs (kinds
interleaved), and the late/early ratio.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from execstate.engine import finisher, step_results
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.output_builder import build_output, on_new_token
from execstate.engine.request import Request
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.tokenizer import Tokenizer
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import VOCAB, write_tokenizer

PROMPT = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
NEVER = "\x00<stop that never matches>\x00"
EARLY_TOKEN = 100
# The functions step() calls to turn sampled tokens into outputs (timed as "output"): by module
# (engine/step_results.py streams and stops, engine/finisher.py builds final outputs).
OUTPUT_FUNCS = ((step_results, ("on_new_token", "build_output")), (finisher, ("build_output",)))


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def _window(n: int, center: int, width: int) -> slice:
    lo = max(0, min(center - width // 2, n - width))
    return slice(lo, lo + width)


@dataclass(frozen=True)
class StepTimes:
    """Per generated token (``[i]`` is the step that produced token i + 1): the step's wall
    time (ITL) and the CPU seconds of the whole step, its forward pass and its output path."""

    itl: list[float]
    step: list[float]
    forward: list[float]
    output: list[float]

    def window(self, center: int, width: int) -> dict[str, Any]:
        w = _window(len(self.itl), center, width)
        host = [s - f for s, f in zip(self.step[w], self.forward[w], strict=True)]
        return {"tokens": f"{w.start + 1}-{w.start + len(self.itl[w])}", "itl_ms": _median_ms(self.itl[w]),
                "forward_ms": _median_ms(self.forward[w]), "host_ms": _median_ms(host),
                "output_ms": _median_ms(self.output[w])}


@contextlib.contextmanager
def _cpu_timing(owner: Any, names: Sequence[str], sink: list[float]) -> Iterator[None]:
    """Add the CPU time spent in ``owner.<name>`` calls to ``sink[-1]`` while active."""
    originals: dict[str, Callable[..., Any]] = {n: getattr(owner, n) for n in names}

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                sink[-1] += time.thread_time() - t0

        return call

    for n, fn in originals.items():
        setattr(owner, n, timed(fn))
    try:
        yield
    finally:
        for n, fn in originals.items():
            setattr(owner, n, fn)


def time_output_path(tokenizer: Tokenizer, params: SamplingParams, num_tokens: int, seed: int = 0) -> list[float]:
    """CPU seconds of the per-token output path for each of ``num_tokens`` random tokens,
    driven without a model the way ``step()`` drives it; the last token finishes (length)."""
    rng = random.Random(seed)
    req = Request("output-path", list(PROMPT), params, max_model_len=len(PROMPT) + num_tokens)
    emits = params.output_kind is not RequestOutputKind.FINAL_ONLY
    k = params.logprobs or 0
    times = []
    for i in range(num_tokens):
        token = rng.randrange(3, VOCAB)
        req.output_token_ids.append(token)
        req.output.logprobs.append(-1.0 - i % 7)
        req.output.top_logprobs.append([((token + j) % VOCAB, -0.5 - j) for j in range(k)])
        t0 = time.thread_time()
        status = on_new_token(req, set(), tokenizer)
        if status is not None:
            req.status = status
            build_output(req, tokenizer, return_routes=False)
        elif emits:
            build_output(req, tokenizer, return_routes=False)
        times.append(time.thread_time() - t0)
    return times


def build_model(out_dir: Path, positions: int) -> Path:
    """The tiny random Qwen3 with ``positions`` positions and the test tokenizer."""
    return write_tokenizer(make_random("qwen3", out_dir, seed=0, max_position_embeddings=positions))


def time_request(engine: LLMEngine, params: SamplingParams, request_id: str) -> StepTimes:
    """Run one request alone to completion, timing every step and its forward pass."""
    if engine.has_unfinished_requests():
        raise ValueError("time_request needs an idle engine (the request must run alone)")
    times = StepTimes([], [], [], [])
    with contextlib.ExitStack() as timing:
        timing.enter_context(_cpu_timing(engine.runner, ["execute"], times.forward))
        for module, names in OUTPUT_FUNCS:
            timing.enter_context(_cpu_timing(module, names, times.output))
        engine.add_request({"prompt_token_ids": PROMPT}, params, request_id=request_id)
        while engine.has_unfinished_requests():
            times.forward.append(0.0)
            times.output.append(0.0)
            t0, c0 = time.perf_counter(), time.thread_time()
            engine.step()
            times.step.append(time.thread_time() - c0)
            times.itl.append(time.perf_counter() - t0)
    del engine.runner.execute  # the instance attribute set by _cpu_timing: back to the class's method
    return times


def run_itl_bench(
    max_tokens: int = 8000, kinds: Sequence[str] = ("delta", "cumulative", "final_only"), logprobs: int | None = 1,
    window: int = 100, threads: int = 1, model: bool = True, repeats: int = 1,
) -> dict[str, Any]:
    """Each window median is the smallest over ``repeats`` runs (kinds interleaved), which
    filters out the load other processes put on a shared machine."""
    if max_tokens < EARLY_TOKEN + window:
        raise ValueError(f"max_tokens must be >= {EARLY_TOKEN + window}, got {max_tokens}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    output_kinds = [RequestOutputKind[k.upper()] for k in kinds]
    paths: dict[str, list[tuple[float, float]]] = {k.name.lower(): [] for k in output_kinds}
    runs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {k.name.lower(): [] for k in output_kinds}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory(prefix="execstate-itl-") as tmp:
            model_dir = build_model(Path(tmp), len(PROMPT) + max_tokens + 16)
            tokenizer = Tokenizer(model_dir)
            engine = LLMEngine(EngineConfig(model=str(model_dir), seed=0)) if model else None
            for r in range(repeats):
                for kind in output_kinds:
                    params = SamplingParams(temperature=1.0, seed=0, max_tokens=max_tokens, ignore_eos=True,
                                            logprobs=logprobs, stop=[NEVER], output_kind=kind)
                    name = kind.name.lower()
                    path = time_output_path(tokenizer, params, max_tokens)
                    paths[name].append((_median_ms(path[_window(max_tokens, EARLY_TOKEN, window)]),
                                        _median_ms(path[_window(max_tokens, max_tokens, window)])))
                    if engine is not None:
                        times = time_request(engine, params, f"itl-{name}-{r}")
                        runs[name].append((times.window(EARLY_TOKEN, window), times.window(max_tokens, window)))
    finally:
        torch.set_num_threads(before)
    report: dict[str, Any] = {
        "workload": {"model": "random qwen3 (2 layers, hidden 64)" if model else None, "prompt_tokens": len(PROMPT),
                     "max_tokens": max_tokens, "logprobs": logprobs, "stop_strings": 1, "window": window,
                     "threads": threads, "repeats": repeats},
        "output_path": {}, "end_to_end": {},
    }
    for name, pairs in paths.items():
        early, late = min(p[0] for p in pairs), min(p[1] for p in pairs)
        report["output_path"][name] = {"early_ms": early, "late_ms": late, "ratio": late / early}
    cols = ("itl", "forward", "host", "output")
    for name, measured in runs.items():
        if measured:
            e = {**measured[0][0], **{f"{c}_ms": min(p[0][f"{c}_ms"] for p in measured) for c in cols}}
            la = {**measured[0][1], **{f"{c}_ms": min(p[1][f"{c}_ms"] for p in measured) for c in cols}}
            report["end_to_end"][name] = {"early": e, "late": la,
                                          **{f"{c}_ratio": la[f"{c}_ms"] / e[f"{c}_ms"] for c in cols}}
    return report


def format_itl_table(report: dict[str, Any]) -> str:
    w = report["workload"]
    n, win = w["max_tokens"], w["window"]
    lines = [
        f"{n} tokens, logprobs={w['logprobs']}, 1 stop string, torch threads {w['threads']}; "
        f"medians over {win} tokens (smallest of {w['repeats']} runs), ms per token",
        "",
        "output path (no model), CPU ms per token",
        f"{'output kind':<12} {'at 100':>9} {f'at {n}':>9} {'late/early':>11}",
    ]
    for kind, r in report["output_path"].items():
        lines.append(f"{kind:<12} {r['early_ms']:>9.4f} {r['late_ms']:>9.4f} {r['ratio']:>10.2f}x")
    if report["end_to_end"]:
        cols = ("itl", "forward", "host", "output")
        lines += ["", "end to end, one request: ITL (wall) and CPU ms per token of forward / host / output",
                  f"{'output kind':<12} {'tokens':>11} {'ITL':>8} {'forward':>8} {'host':>8} {'output':>8}"]
        for kind, r in report["end_to_end"].items():
            for name in ("early", "late"):
                x = r[name]
                values = " ".join(f"{x[f'{c}_ms']:>8.3f}" for c in cols)
                lines.append(f"{kind if name == 'early' else '':<12} {x['tokens']:>11} {values}")
            ratios = " ".join(f"{r[f'{c}_ratio']:>7.2f}x" for c in cols)
            lines.append(f"{'':<12} {'late/early':>11} {ratios}")
    return "\n".join(lines)
