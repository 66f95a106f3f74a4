"""Large-M fp32 GEMM on this CPU, library by library (part of ``execstate bench kernels``).

The prefill GEMMs of the standard model (8 x 256 prompt tokens: 2048 rows; an expert sees
~2048 * top-2 / 8 = 512), ``y = x @ w.T``, each computed by

- ``torch``: ``F.linear`` (torch's CPU BLAS: MKL on x86 wheels);
- ``onednn``: torch's oneDNN linear on a prepacked weight (``torch.utils.mkldnn``);
- ``openblas``: numpy's ``x @ w.T`` (numpy's bundled OpenBLAS);
- ``execstate``: ``cpu.linear`` (the AVX-512 register-blocked ``linear_packed`` where it runs,
  else the AVX2 row kernel). The only one of the four that is batch-invariant (a row's result
  does not depend on M), which is why the engine uses it even where a library is faster.

Timed interleaved per repeat, median wall seconds, as GFLOP/s (2 M K N / s); weights stay in
cache (a prefill GEMM is compute-bound). Libraries that fail to import are left out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from execstate.kernels import cpu

# (label, M, K, N) of the standard model's prefill GEMMs
SHAPES = (("qkv_proj", 2048, 512, 1024), ("o_proj", 2048, 512, 512),
          ("expert gate_up", 512, 512, 1536), ("expert down", 512, 768, 512))


def _libraries(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    libs: dict[str, Callable[[], Any]] = {"torch": lambda: F.linear(x, w)}
    try:
        from torch.utils import mkldnn as mkldnn_utils

        if torch.backends.mkldnn.is_available():
            dense = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            dense.weight.data = w
            packed, xm = mkldnn_utils.to_mkldnn(dense), x.to_mkldnn()
            libs["onednn"] = lambda: packed(xm)
    except Exception:  # noqa: BLE001 - oneDNN missing or refusing this build: leave it out
        pass
    xn, wtn = x.numpy(), w.numpy().T
    libs["openblas"] = lambda: xn @ wtn
    if cpu.available():
        libs["execstate"] = lambda: cpu.linear(x, w)
    return libs


def gemm_library_rows(repeats: int, gen: torch.Generator, calls: int = 5) -> list[dict[str, Any]]:
    rows = []
    for label, m, k, n in SHAPES:
        x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * 0.05
        libs = _libraries(x, w)
        times: dict[str, list[float]] = {name: [] for name in libs}
        for fn in libs.values():
            fn()  # warm (packing, thread pools)
        for _ in range(repeats):
            for name, fn in libs.items():
                t = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - t) / calls)
        flop = 2 * m * k * n
        rows.append({"case": f"{label} M={m} K={k} N={n}",
                     "gflop_s": {name: flop / statistics.median(ts) / 1e9 for name, ts in times.items()}})
    return rows


def format_gemm_rows(rows: list[dict[str, Any]]) -> list[str]:
    names = list(dict.fromkeys(name for r in rows for name in r["gflop_s"]))
    lines = ["", "prefill GEMM (fp32, y = x @ w.T) by library, GFLOP/s (median wall time):",
             f"{'case':40s}" + "".join(f"{n:>11s}" for n in names)]
    for r in rows:
        lines.append(f"{r['case']:40s}" + "".join(f"{r['gflop_s'].get(n, float('nan')):11.1f}" for n in names))
    return lines
