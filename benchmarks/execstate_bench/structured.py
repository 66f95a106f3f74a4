"""The cost of constrained decoding: tokens/s with and without a JSON schema, execstate and vLLM.

Workload: SmolLM2-135M-Instruct (the embedded ``smollm2-135m``), chat prompts asking for JSON,
greedy, exactly ``max_tokens`` tokens per prompt (``ignore_eos``; the schema's ``minItems`` keeps
the document open past ``max_tokens``, so both runs generate the same number of tokens), batch 1
and batch 8. Each engine runs plain and constrained generations interleaved in one process
(``repeats`` pairs after a warm-up of each); ``summary`` gives the ratios of the best runs, of
adjacent pairs and (execstate and vLLM with psutil) of CPU seconds: on a shared machine the
best and the CPU-time ratios are the least disturbed.
vLLM (its CPU venv, ``make vllm-venv``; ``structured_vllm.py``) runs the same prompts and schema
with its xgrammar and guidance backends.

Run: ``python -m execstate_bench.structured [--vllm-python PATH] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "array", "minItems": 64,
    "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Berlin", "Tokyo", "Lima"]}},
        "required": ["name", "age", "city"], "additionalProperties": False},
}


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"<|im_start|>user\nList the people of group {i} as JSON.<|im_end|>\n"
                             "<|im_start|>assistant\n", add_special_tokens=False) for i in range(n)]


def measure_execstate(model: str, batches: list[int], max_tokens: int, repeats: int) -> dict[str, Any]:
    from execstate.engine.grammar.spec import StructuredOutputsParams
    from execstate.engine.sampling_params import SamplingParams
    from execstate.session.lm.llm import LLM

    llm = LLM(model, max_num_seqs=max(batches))
    ps = prompts(llm.get_tokenizer(), max(batches))
    plain = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    schema = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    out: dict[str, Any] = {"batches": {}}
    for b in batches:
        runs: dict[str, list[float]] = {"plain": [], "schema": [], "plain_cpu": [], "schema_cpu": []}
        batch = [{"prompt_token_ids": p} for p in ps[:b]]
        llm.generate(batch, plain, use_tqdm=False)
        llm.generate(batch, schema, use_tqdm=False)
        sample = ""
        for _ in range(repeats):
            for name, sp in (("plain", plain), ("schema", schema)):
                t0, c0 = time.perf_counter(), time.process_time()
                res = llm.generate(batch, sp, use_tqdm=False)
                runs[name].append(time.perf_counter() - t0)
                runs[f"{name}_cpu"].append(time.process_time() - c0)  # every thread of the process
                assert all(len(r.outputs[0].token_ids) == max_tokens for r in res)
                sample = res[0].outputs[0].text if name == "schema" else sample
        out["batches"][str(b)] = {**runs, "sample": sample[:200]}
    return out


def measure_vllm(python: str, model_dir: str, batches: list[int], max_tokens: int, repeats: int,
                 backend: str, ids: list[list[int]]) -> dict[str, Any] | None:
    from execstate_bench.vllm_peer import cpu_env

    cfg = {"model": model_dir, "schema": SCHEMA, "prompts": ids, "batches": batches, "max_tokens": max_tokens,
           "repeats": repeats, "backend": backend}
    script = Path(__file__).with_name("structured_vllm.py")
    threads = os.cpu_count() or 1
    proc = subprocess.run([python, str(script)], input=json.dumps(cfg), capture_output=True, text=True,
                          env={**os.environ, **cpu_env(threads, python)}, timeout=3600)
    if proc.returncode != 0:
        print(f"vLLM ({backend}) failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(run: dict[str, Any], max_tokens: int) -> dict[str, dict[str, float]]:
    """Per batch: the best tokens/s plain and constrained (the least disturbed run on a shared
    machine), and constrained / plain twice: of the best runs, and the median over the repeats of
    each adjacent pair's ratio (a pair runs under about the same load)."""
    out = {}
    for b, r in run["batches"].items():
        n = int(b) * max_tokens
        plain, schema = n / min(r["plain"]), n / min(r["schema"])
        pairs = statistics.median(p / s for p, s in zip(r["plain"], r["schema"], strict=True))
        out[b] = {
            "plain_tok_s": round(plain, 1),
            "schema_tok_s": round(schema, 1),
            "ratio_best": round(schema / plain, 3),
            "ratio_pairs": round(pairs, 3),
        }
        if r.get("plain_cpu"):  # CPU seconds per run: less disturbed by other processes than wall time
            out[b]["ratio_cpu"] = round(statistics.median(r["plain_cpu"]) / statistics.median(r["schema_cpu"]), 3)
    return out


def main(argv: list[str] | None = None) -> None:
    from execstate.help_text import plain

    ap = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm-python", default=os.environ.get("EXECSTATE_VLLM_PYTHON"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    from execstate.engine.tokenizer import Tokenizer
    from execstate.model.registry import resolve_model

    model_dir = resolve_model(args.model)
    results: dict[str, Any] = {"schema": SCHEMA, "max_tokens": args.max_tokens, "repeats": args.repeats,
                               "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]}
    results["execstate"] = measure_execstate(args.model, batches, args.max_tokens, args.repeats)
    if args.vllm_python:
        ids = prompts(Tokenizer(model_dir), max(batches))
        for backend in ("xgrammar", "guidance"):
            results[f"vllm_{backend}"] = measure_vllm(args.vllm_python, str(model_dir), batches, args.max_tokens,
                                                      args.repeats, backend, ids)
    results["load_1min_end"] = os.getloadavg()[0]
    table = {k: summary(v, args.max_tokens) for k, v in results.items() if isinstance(v, dict) and "batches" in v}
    results["summary"] = table
    print(json.dumps(table, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
