"""What the tenant in the execution identity costs: ``execstate bench identity``.

Workload (offline, one engine, one request at a time so each request's prefill is its own
TTFT): ``users`` users talk under ``systems`` shared system prompts of ``system_len`` tokens for
``turns`` turns of ``user_len`` tokens; each request is the system prompt, the user's history and
its new turn, answered with one token (TTFT = the request's wall time: tokenised ids in, first
token out). Reported per variant: the prefix hit rate (cached prompt tokens / prompt tokens) and
TTFT p50/p99.

Variants:

- ``one tenant``: ``LLM.generate`` with plain prompts, the API every version of execstate has;
  ``--baseline-tree DIR`` runs the same code against another checkout (e.g. the commit before
  the tenant entered the identity) in a subprocess, alternating with this tree round by round,
  so the two are measured under the same load: the hit rate must be equal, TTFT within noise;
- ``N tenants``: the users split over ``tenants`` tenants (``engine.add_request(scope=...)``),
  every system prompt used by every tenant: each tenant computes each system prompt once, which
  is the cost of isolation;
- ``N tenants, one shared group``: the same scopes in one operator group: the hit rate of one
  tenant again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

WORKLOAD = {"systems": 4, "system_len": 256, "users": 8, "turns": 3, "user_len": 32}


def _prompts(w: dict[str, int]) -> list[tuple[int, list[int]]]:
    """(user, prompt ids) in the order they are sent (turn by turn across users)."""
    rng = np.random.default_rng(0)
    systems = [rng.integers(3, 500, w["system_len"]).tolist() for _ in range(w["systems"])]
    history = {u: list(systems[u % w["systems"]]) for u in range(w["users"])}
    out = []
    for _ in range(w["turns"]):
        for u in range(w["users"]):
            history[u] = history[u] + rng.integers(3, 500, w["user_len"]).tolist()
            out.append((u, list(history[u])))
            history[u] = history[u] + [7]  # the one-token answer (greedy decodes are not needed)
    return out


def run_variant(model: str, tenants: int = 1, shared: bool = False, w: dict[str, int] | None = None) -> dict[str, Any]:
    """One variant in this process (module docstring)."""
    from execstate import LLM, SamplingParams

    w = w or WORKLOAD
    llm = LLM(model, seed=0, num_kv_blocks=4096, max_model_len=4096)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    ttft, cached, total = [], 0, 0
    scopes = None
    if tenants > 1:
        from execstate.identity.scope import PrefixSharing
        from execstate.identity.tenant import TenantId

        names = [f"tenant-{t}" for t in range(tenants)]
        sharing = PrefixSharing.parse(["all=" + ",".join(names)] if shared else [])
        scopes = [sharing.scope(TenantId(n)) for n in names]
    for u, ids in _prompts(w):
        t0 = time.perf_counter()
        if scopes is None:
            out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
        else:
            eng = llm.engine
            rid = eng.add_request({"prompt_token_ids": ids}, params,
                                  scope=scopes[(u // w["systems"]) % len(scopes)])
            out = None
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.request_id == rid and o.finished:
                        out = o
            assert out is not None
        ttft.append(time.perf_counter() - t0)
        cached += out.num_cached_tokens
        total += len(ids)
    return {"tenants": tenants, "shared": shared, "hit_rate": round(cached / total, 4),
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1e3, 2),
            "ttft_p99_ms": round(float(np.percentile(ttft, 99)) * 1e3, 2), "requests": len(ttft)}


def _in_tree(tree: Path, model: str) -> dict[str, Any]:
    """The one-tenant variant with ``tree``'s execstate (this module's code, run from its file)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = (f"import json, runpy; m = runpy.run_path({str(Path(__file__))!r}); "
            f"print(json.dumps(m['run_variant']({model!r})))")
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, timeout=1800,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_identity_bench(model: str, tenants: int = 4, rounds: int = 3, baseline_tree: str | None = None) -> dict:
    from execstate_bench.machine import loadavg

    report: dict[str, Any] = {"workload": WORKLOAD, "model": model, "load_before": loadavg(), "rounds": []}
    for _ in range(rounds):
        r: dict[str, Any] = {}
        if baseline_tree is not None:
            r["baseline_one_tenant"] = _in_tree(Path(baseline_tree), model)
        r["one_tenant"] = _in_tree(Path(__file__).resolve().parents[2], model)
        r["tenants"] = run_variant(model, tenants)
        r["tenants_shared"] = run_variant(model, tenants, shared=True)
        report["rounds"].append(r)
    report["load_after"] = loadavg()
    return report


def format_identity_table(report: dict) -> str:
    lines = [f"{'variant':<28} {'hit rate':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}"]
    for i, r in enumerate(report["rounds"]):
        for name, v in r.items():
            lines.append(f"{name + f' (round {i + 1})':<28} {v['hit_rate']:>9.3f} {v['ttft_p50_ms']:>12.1f} "
                         f"{v['ttft_p99_ms']:>12.1f}")
    return "\n".join(lines)
