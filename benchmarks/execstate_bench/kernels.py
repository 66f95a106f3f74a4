"""``execstate bench kernels``: execstate's CPU kernels against the torch ops they replace.

Each case runs the torch path and the kernel path on the same inputs, interleaved per
repeat, and reports the median time, the effective weight bandwidth (bytes of weights
read / time; weights are cycled through a set larger than the L3 cache, as in a real
decode step) and the speed-up. Cases, on the standard model's shapes (hidden 512, 8
experts of 768, 8/4 heads of 64, vocab 32000):

- ``linear``: ``F.linear`` vs ``cpu.linear`` for M = 1..64 rows on the expert and LM-head
  weights (where the kernel stops winning sets ``MAX_LINEAR_ROWS``);
- ``moe``: the torch expert loop of ``SparseMoE`` vs the fused ``cpu.moe`` for 1..64 tokens
  (where it stops winning sets ``MAX_MOE_TOKENS``);
- ``decode attention``: gather + SDPA vs ``PagedDecode`` for batch 1 and 8, 384 positions;
- ``prefill GEMM``: torch (MKL), oneDNN, OpenBLAS and execstate on the prefill shapes
  (``gemm_libraries``), GFLOP/s.

The maximum absolute difference between the two paths is printed per case as a sanity
check (both are fp32; they round differently).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from execstate.kernels import cpu
from execstate.model.moe import experts_torch
from execstate_bench.gemm_libraries import format_gemm_rows, gemm_library_rows

L3_BYTES = 32 << 20
CYCLE_BYTES = 4 * L3_BYTES  # weights cycled per timing so they come from DRAM


def _time(fn: Callable[[int], Any], n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``fn(i)`` for i < n."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        out.append((time.perf_counter() - t) / n)
    return statistics.median(out)


def _pair(name: str, torch_fn: Callable[[int], torch.Tensor], kernel_fn: Callable[[int], torch.Tensor],
          n: int, weight_bytes: int, repeats: int) -> dict[str, Any]:
    diff = (torch_fn(0) - kernel_fn(0)).abs().max().item()
    t_torch, t_kernel = [], []
    for _ in range(repeats):  # interleaved: noise hits both alike
        t_torch.append(_time(torch_fn, n, 1))
        t_kernel.append(_time(kernel_fn, n, 1))
    tt, tk = statistics.median(t_torch), statistics.median(t_kernel)
    return {"case": name, "torch_us": tt * 1e6, "kernel_us": tk * 1e6, "speedup": tt / tk,
            "torch_gb_s": weight_bytes / tt / 1e9, "kernel_gb_s": weight_bytes / tk / 1e9, "max_abs_diff": diff}


def _weights(shape: tuple[int, ...], gen: torch.Generator) -> list[torch.Tensor]:
    nbytes = 4 * int(torch.tensor(shape).prod())
    return [torch.randn(shape, generator=gen) * 0.05 for _ in range(max(2, CYCLE_BYTES // nbytes))]


def run_kernel_bench(repeats: int = 5, threads: int | None = None) -> dict[str, Any]:
    if not cpu.available():
        raise RuntimeError(f"execstate CPU kernels unavailable: {cpu.unavailable_reason()}")
    if threads:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for label, (n_out, n_in) in (("expert gate_up 1536x512", (1536, 512)), ("lm_head 32000x512", (32000, 512))):
        ws = _weights((n_out, n_in), gen)
        for m in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(m, n_in, generator=gen)
            # (mypy cannot type a lambda with default arguments: the ignores below)
            rows.append(_pair(f"linear {label} M={m}", lambda i, x=x, ws=ws: F.linear(x, ws[i]),  # type: ignore[misc]
                              lambda i, x=x, ws=ws: cpu.linear(x, ws[i]),  # type: ignore[misc]
                              len(ws), 4 * n_out * n_in, repeats))
    e, h, inter, k = 8, 512, 768, 2
    gus, downs = _weights((e, 2 * inter, h), gen), _weights((e, h, inter), gen)
    for t in (1, 2, 8, 16, 32, 64):
        x = torch.randn(t, h, generator=gen)
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
        wts = torch.rand(t, k, generator=gen)
        active = len(set(ids.flatten().tolist()))
        rows.append(_pair(f"moe {t} tokens ({active} experts)",
                          lambda i, x=x, ids=ids, wts=wts: experts_torch(x, ids, wts, gus[i], downs[i]),  # type: ignore[misc]
                          lambda i, x=x, ids=ids, wts=wts: cpu.moe(x, ids, wts, gus[i], downs[i]),  # type: ignore[misc]
                          len(gus), active * 3 * inter * h * 4, repeats))
    rows += _attention_cases(gen, repeats)
    return {"threads": torch.get_num_threads(), "repeats": repeats, "rows": rows,
            "prefill_gemm": gemm_library_rows(repeats, gen)}


def _attention_cases(gen: torch.Generator, repeats: int) -> list[dict[str, Any]]:
    nh, nkv, d, bs, ctx = 8, 4, 64, 16, 384
    rows = []
    for b in (1, 8):
        nblocks = b * (ctx // bs)
        kc = torch.randn(nblocks * bs, nkv, d, generator=gen)
        vc = torch.randn(nblocks * bs, nkv, d, generator=gen)
        tables = [list(range(i * (ctx // bs), (i + 1) * (ctx // bs))) for i in range(b)]
        q = torch.randn(b, nh, d, generator=gen)
        slots = torch.tensor([[blk * bs + o for blk in t for o in range(bs)] for t in tables])
        decode = cpu.PagedDecode(list(range(b)), tables, [ctx] * b, bs, nblocks * bs)

        def torch_path(i: int, q: torch.Tensor = q, kc: torch.Tensor = kc, vc: torch.Tensor = vc,
                       slots: torch.Tensor = slots, b: int = b) -> torch.Tensor:
            qd = q.view(b, nkv, nh // nkv, d)
            out = F.scaled_dot_product_attention(qd, kc[slots].transpose(1, 2), vc[slots].transpose(1, 2))
            return out.reshape(b, nh, d)

        def kernel_path(i: int, q: torch.Tensor = q, kc: torch.Tensor = kc, vc: torch.Tensor = vc,
                        decode: cpu.PagedDecode = decode) -> torch.Tensor:
            out = torch.empty_like(q)
            decode.run(q, kc, vc, out, d**-0.5)
            return out

        rows.append(_pair(f"decode attention batch {b}, {ctx} positions", torch_path, kernel_path, 50,
                          2 * b * ctx * nkv * d * 4, repeats))
    return rows


def format_kernel_table(report: dict[str, Any]) -> str:
    lines = [f"execstate CPU kernels vs torch, {report['threads']} threads, median of {report['repeats']} "
             "interleaved repeats (GB/s = weight or KV bytes read / time)",
             f"{'case':48s} {'torch us':>10s} {'kernel us':>10s} {'torch GB/s':>10s} {'kernel GB/s':>11s} "
             f"{'speed-up':>8s} {'max |diff|':>10s}"]
    for r in report["rows"]:
        lines.append(f"{r['case']:48s} {r['torch_us']:10.1f} {r['kernel_us']:10.1f} {r['torch_gb_s']:10.1f} "
                     f"{r['kernel_gb_s']:11.1f} {r['speedup']:7.2f}x {r['max_abs_diff']:10.1e}")
    lines += format_gemm_rows(report.get("prefill_gemm", []))
    return "\n".join(lines)
