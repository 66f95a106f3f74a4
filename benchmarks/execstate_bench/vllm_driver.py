"""The vLLM side of the throughput benchmark's vLLM peer: a script run by the python of a venv
where vLLM's CPU build is installed (``python vllm_driver.py``), driven by ``VllmPeer``
(``benchmarks/execstate_bench/vllm_peer.py``) over pipes. It imports only the standard library until a
``load`` request imports vLLM, so it runs (and answers ``probe``) under any python >= 3.10,
and never imports execstate (that venv does not have it).

Protocol: one JSON object per line on stdin; one JSON reply per line on the protocol stream
(the original stdout; fd 1 is pointed at stderr before anything else runs, so vLLM's logs,
its engine process's included, never mix into it). Every reply has ``ok``; a failed request
answers ``{"ok": false, "error": "..."}`` and the driver keeps serving.

- ``{"op": "probe"}`` -> ``python`` (version), ``vllm`` (version, or ``null`` when vLLM does
  not import, with ``vllm_error``). Imports vLLM's package only (not its engine).
- ``{"op": "load", "model": DIR, "dtype": "float32", "max_model_len": N, "max_num_seqs": N,
  "seed": N}`` -> ``seconds`` (engine start), ``vllm``, ``settings``. ``LLM(model=DIR, ...)``
  with vLLM's default (compiled) mode, no tokenizer (prompts are token ids) and prefix caching
  off (so a prefill probe cannot warm the timed run; the workload never repeats a prompt).
  CPU settings come from the environment (``VLLM_CPU_KVCACHE_SPACE``,
  ``VLLM_CPU_OMP_THREADS_BIND``), set by the peer. At most one load per driver.
- ``{"op": "generate", "prompts": [[ids]], "max_tokens": N, "batched": bool,
  "probe_prefill": bool}`` -> ``seconds`` (wall time of the timed generation), ``token_ids``
  (per prompt), ``prefill_seconds`` (with ``probe_prefill``: per call, the wall time of an
  untimed ``max_tokens=1`` run of the same prompts just before it, i.e. the time to first
  token; else ``null``), ``cpu_seconds`` (CPU time of this process and its children over the
  timed generation, ``null`` without psutil). ``batched``: all prompts in one call, else one
  call per prompt. Greedy (temperature 0), ``ignore_eos``, exactly ``max_tokens`` per prompt.
- ``{"op": "quit"}`` -> ``{"ok": true}``, then the driver exits 0 (so does end of input).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder (benchmarks/execstate_bench) is sys.path[0], and its numbers.py
# would shadow the standard library's `numbers` that vLLM's dependencies import.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import json  # noqa: E402 - after the sys.path fix above
import platform  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

PROTOCOL = 1
OPS = ("probe", "load", "generate", "quit")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_request(req: Any, loaded: bool) -> str | None:
    """Why ``req`` is not a valid request (``loaded``: whether a model is loaded), else ``None``."""
    if not isinstance(req, dict):
        return "a request must be a JSON object"
    op = req.get("op")
    if op not in OPS:
        return f"unknown op {op!r} (expected one of {', '.join(OPS)})"
    if op == "load":
        if loaded:
            return "a model is already loaded (one load per driver)"
        if not isinstance(req.get("model"), str) or not os.path.isdir(req["model"]):
            return f"model must be a directory, got {req.get('model')!r}"
        if req.get("dtype", "float32") not in ("float32", "bfloat16", "float16"):
            return f"unsupported dtype {req.get('dtype')!r}"
        for k in ("max_model_len", "max_num_seqs", "seed"):
            if k in req and not (_is_int(req[k]) and req[k] >= 0):
                return f"{k} must be a non-negative integer"
    if op == "generate":
        if not loaded:
            return "no model loaded (send a load request first)"
        prompts = req.get("prompts")
        if not isinstance(prompts, list) or not prompts:
            return "prompts must be a non-empty list of token id lists"
        for p in prompts:
            if not isinstance(p, list) or not p or not all(_is_int(t) and t >= 0 for t in p):
                return "every prompt must be a non-empty list of non-negative token ids"
        if not (_is_int(req.get("max_tokens")) and req["max_tokens"] >= 1):
            return "max_tokens must be a positive integer"
        for k in ("batched", "probe_prefill"):
            if not isinstance(req.get(k, False), bool):
                return f"{k} must be a boolean"
    return None


def _cpu_seconds() -> float | None:
    """CPU time of this process and its live children (vLLM's engine core runs in one)."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


class Driver:
    def __init__(self) -> None:
        self.llm: Any = None

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "probe":
            return self._probe()
        if op == "load":
            return self._load(req)
        if op == "generate":
            return self._generate(req)
        return {"ok": True}

    @staticmethod
    def _probe() -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "protocol": PROTOCOL, "python": platform.python_version(),
                               "executable": sys.executable, "vllm": None}
        try:
            import vllm

            out["vllm"] = str(getattr(vllm, "__version__", "unknown"))
        except Exception as e:  # noqa: BLE001 - ImportError or a broken native library
            out["vllm_error"] = f"{type(e).__name__}: {e}"[:500]
        return out

    def _load(self, req: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM

        kwargs: dict[str, Any] = {"model": req["model"], "dtype": req.get("dtype", "float32"),
                                  "skip_tokenizer_init": True, "enable_prefix_caching": False,
                                  "seed": req.get("seed", 0)}
        for k in ("max_model_len", "max_num_seqs"):
            if req.get(k):
                kwargs[k] = req[k]
        self.llm = LLM(**kwargs)
        env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU_", "OMP_", "KMP_", "LD_PRELOAD"))}
        return {"ok": True, "seconds": time.perf_counter() - t0, "vllm": str(vllm.__version__),
                "settings": {"llm_kwargs": kwargs, "env": env}}

    def _call(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def _generate(self, req: dict[str, Any]) -> dict[str, Any]:
        prompts, n = req["prompts"], req["max_tokens"]
        groups = [prompts] if req.get("batched", False) else [[p] for p in prompts]
        prefill: list[float] | None = [] if req.get("probe_prefill", False) else None
        tokens: list[list[int]] = []
        seconds = 0.0
        cpu: float | None = 0.0
        for g in groups:
            if prefill is not None:
                t0 = time.perf_counter()
                self._call(g, 1)
                prefill.append(time.perf_counter() - t0)
            c0 = _cpu_seconds()
            t0 = time.perf_counter()
            tokens += self._call(g, n)
            seconds += time.perf_counter() - t0
            c1 = _cpu_seconds()
            cpu = None if c0 is None or c1 is None or cpu is None else cpu + (c1 - c0)
        return {"ok": True, "seconds": seconds, "token_ids": tokens, "prefill_seconds": prefill,
                "cpu_seconds": cpu}


def serve(lines: Any, proto: Any) -> int:
    """Answer every request line of ``lines`` on ``proto`` until ``quit`` or end of input."""
    driver = Driver()
    for line in lines:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            reply: dict[str, Any] = {"ok": False, "error": f"not JSON: {e}"}
            req = None
        else:
            err = check_request(req, driver.llm is not None)
            if err is not None:
                reply = {"ok": False, "error": err}
            else:
                try:
                    reply = driver.handle(req)
                except Exception as e:  # noqa: BLE001 - reported to the peer, which raises it
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
        if isinstance(req, dict) and req.get("op") == "quit":
            break
    return 0


def main() -> int:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # everything else written to fd 1 (vLLM's logs, child processes) goes to stderr
    sys.stdout = sys.stderr
    return serve(sys.stdin, proto)


if __name__ == "__main__":
    raise SystemExit(main())
