"""The vLLM side of ``bench structured`` (``benchmarks/execstate_bench/structured.py``): run by the python of
vLLM's CPU venv, standard library only until vLLM loads; never imports execstate.

Input: one JSON object on stdin ``{"model": DIR, "schema": {...}, "prompts": [[ids]], "batches":
[1, 8], "max_tokens": N, "repeats": R, "backend": "xgrammar" | "guidance"}``. Output: one JSON
line on the original stdout (vLLM's logs go to stderr): per batch size, the wall seconds of each
repeat without and with the schema (interleaved), greedy, ``ignore_eos``, exactly ``max_tokens``
tokens per prompt.
"""

from __future__ import annotations

import os
import sys

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder's numbers.py would shadow the standard library's

import json  # noqa: E402
import time  # noqa: E402


def _cpu() -> float:
    """CPU seconds of this process and its children (vLLM's engine core), 0 without psutil."""
    try:
        import psutil
    except ImportError:
        return 0.0
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    cfg = json.loads(sys.stdin.read())
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = LLM(model=cfg["model"], dtype="float32", enable_prefix_caching=False, seed=0,
              max_model_len=cfg.get("max_model_len", 1024), max_num_seqs=max(cfg["batches"]),
              structured_outputs_config={"backend": cfg.get("backend", "xgrammar")})
    plain = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], ignore_eos=True,
                                 structured_outputs=StructuredOutputsParams(json=cfg["schema"]))
    result: dict = {"vllm": vllm.__version__, "backend": cfg.get("backend", "xgrammar"), "batches": {}}
    for b in cfg["batches"]:
        prompts = [{"prompt_token_ids": p} for p in cfg["prompts"][:b]]
        runs: dict[str, list[float]] = {"plain": [], "schema": [], "plain_cpu": [], "schema_cpu": []}
        texts: list[str] = []
        llm.generate(prompts, plain, use_tqdm=False)  # warm-up, both
        llm.generate(prompts, constrained, use_tqdm=False)
        for _ in range(cfg["repeats"]):
            for name, sp in (("plain", plain), ("schema", constrained)):
                t0, c0 = time.perf_counter(), _cpu()
                outs = llm.generate(prompts, sp, use_tqdm=False)
                runs[name].append(time.perf_counter() - t0)
                runs[f"{name}_cpu"].append(_cpu() - c0)
                if name == "schema":
                    texts = [o.outputs[0].text for o in outs]
                    assert all(len(o.outputs[0].token_ids) == cfg["max_tokens"] for o in outs)
        result["batches"][str(b)] = {**runs, "sample": texts[0][:200]}
    out.write(json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
