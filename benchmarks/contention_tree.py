"""The contention bench's workload against any checkout of execstate, for before/after figures.

``execstate bench throughput --contention`` compares the two ``kernel_team`` policies of one
build; a tree from before the team governor has neither the bench nor that setting. This script
repeats the bench's workload (the same busy processes, prompts drawn from the same seed in the
same order, batch-1 and batch-8 greedy decode, tok/s after the first token) with only the public
``LLM`` API, so it runs under any tree's interpreter::

    TREE/.venv/bin/python benchmarks/contention_tree.py --loads 4,8,16 --policies default --out F

``--policies default`` builds the engine without ``kernel_team`` (the tree's own behaviour);
``full,adaptive`` alternates two engines in one process like the bench. The report is rewritten
after every run, so a run cut by a time limit keeps what it measured. It also records each run's
generated ids, so two trees' runs on the same prompts can be compared token for token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_BURN = "while True:\n    pass\n"


def _llm(path: str, policy: str) -> Any:
    from execstate.session.lm.llm import LLM

    return LLM(path) if policy == "default" else LLM(path, kernel_team=policy)


def _decode(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, list[list[int]]]:
    """(decode tok/s after the first token, wall seconds of the run, generated ids)."""
    from execstate.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    end = time.monotonic()
    first = max(o.metrics["first_token_time"] for o in outs)
    rate = len(prompts) * (max_tokens - 1) / max(end - first, 1e-9)
    return rate, end - t0, [list(o.outputs[0].token_ids) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--loads", default="4,8,16", help="added busy processes per level")
    ap.add_argument("--policies", default="default", help="'default' or a list of kernel_team values")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import execstate
    from execstate.model.registry import resolve_model

    path = str(resolve_model(args.model))
    policies = args.policies.split(",")
    engines = {p: _llm(path, p) for p in policies}
    first = engines[policies[0]]
    vocab = first.engine.model_config.vocab_size
    rng = np.random.default_rng(args.seed)
    warm = rng.integers(0, vocab, size=(1, args.prompt_len)).tolist()
    for llm in engines.values():
        _decode(llm, warm, 4)
    report: dict[str, Any] = {"tree": str(Path(execstate.__file__).resolve().parent.parent), "model": args.model,
                              "policies": policies, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                              "threads": __import__("torch").get_num_threads(), "levels": []}
    out = Path(args.out)
    for n in (int(x) for x in args.loads.split(",")):
        level: dict[str, Any] = {"burners": n, "runs": []}
        report["levels"].append(level)
        procs = [subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.DEVNULL) for _ in range(n)]
        try:
            time.sleep(1.0 if n else 0.0)
            for b in (int(x) for x in args.batches.split(",")):
                prompts = rng.integers(0, vocab, size=(b, args.prompt_len)).tolist()
                for p in policies:
                    time.sleep(0.5)
                    before = os.getloadavg()[0]
                    rate, wall, ids = _decode(engines[p], prompts, args.max_tokens)
                    level["runs"].append({"policy": p, "batch": b, "tok_s": round(rate, 3),
                                          "step_ms": round(1000 * b / rate, 1), "wall_s": round(wall, 1),
                                          "load_before": before, "load_after": os.getloadavg()[0], "ids": ids})
                    out.write_text(json.dumps(report, indent=1))
                    print(f"burners={n} batch={b} {p}: {rate:.2f} tok/s ({wall:.0f} s)", flush=True)
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait()


if __name__ == "__main__":
    main()
