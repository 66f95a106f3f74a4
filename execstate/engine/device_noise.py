"""Counter-based noise for the sampler's race on a device: reproducible per request, no device RNG state.

The sampler draws token ``argmax(probs / q)`` with ``q ~ Exp(1)`` per token (``engine/sampler.py``).
On the CPU each row's ``u ~ U(0, 1)`` comes from its ``torch.Generator``. On a GPU that would
need one generator on the device per seeded request (its state would no longer be the host state
sessions checkpoint and migrate) or a vocabulary-sized upload per row. Instead:

1. ``race_keys``: each row draws one 62-bit key per step on the host from its own generator (a
   seeded request's, else the shared one, one batched draw per generator, as on the CPU), so the
   generators advance exactly as the request's history says;
2. ``race_hashed``: on the device, ``u[t] = hash(key, t)`` for every token ``t`` of the row
   (lowbias32, a 32-bit integer mixer, twice, in int64 arithmetic that never overflows), 23 bits
   of it as ``(h + 0.5) / 2**23`` in ``(0, 1)``; then ``q = -log(u)`` and the argmax.

A row's token depends on its probabilities and its key only: seeded requests reproduce and do not
depend on their batch mates. One launch per op for the whole batch (no per-row launches), so
the sampler can be captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_KEY_HIGH = 1 << 62


def race_keys(params: list, generators: list[torch.Generator | None]) -> np.ndarray:
    """int64 ``[rows]``: one key per row from its generator (seeded rows: their own, one draw
    each; the others one batched draw per shared generator, in row order)."""
    keys = np.empty(len(params), dtype=np.int64)
    shared: dict[int, tuple[torch.Generator | None, list[int]]] = {}
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.seed is None:
            shared.setdefault(id(g), (g, []))[1].append(i)
        else:
            torch.randint(0, _KEY_HIGH, (1,), generator=g, out=torch.from_numpy(keys[i : i + 1]))
    for gen, rows in shared.values():
        drawn = np.empty(len(rows), dtype=np.int64)
        torch.randint(0, _KEY_HIGH, (len(rows),), generator=gen, out=torch.from_numpy(drawn))
        keys[rows] = drawn
    return keys


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """``(a * c) mod 2**32`` for ``a`` in ``[0, 2**32)`` (int64), without int64 overflow."""
    return ((a & 0xFFFF) * c + ((((a >> 16) * c) & 0xFFFF) << 16)) & _M32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijective 32-bit integer mixer."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def hashed_uniform(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 ``[rows, vocab]`` in ``(0, 1)``: ``u[r, t]`` a hash of ``(keys[r], t)``."""
    k1 = _mix32(keys & _M32)[:, None]
    k2 = _mix32((keys >> 32) ^ 0x9E3779B9)[:, None]
    cols = torch.arange(vocab, device=keys.device, dtype=torch.int64)[None, :]
    h = _mix32(_mix32(cols ^ k1) ^ k2)
    return ((h >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def race_hashed(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[rows, vocab]`` (modified in place): ``argmax(probs / q)``,
    ``q = -log(u)``, ``u = hashed_uniform(keys)``; an exact sample of each row's distribution."""
    q = hashed_uniform(keys, probs.shape[1]).log_().neg_()
    return probs.div_(q).argmax(dim=-1)
