"""An independent float64 reference of what the sampler samples from (and of the penalties).

Written plainly, one row at a time, from the definitions (vLLM v1 / OpenAI / HF), not from
execstate's code: temperature, then min_p, then top_k, then top_p, renormalising after
each filter.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x[np.isfinite(x)].max())
    e[~np.isfinite(x)] = 0.0
    return e / e.sum()


def exact_distribution(
    logits, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    p = softmax(np.asarray(logits, dtype=np.float64) / temperature)
    if min_p > 0.0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: -p[i])  # most likely first
    if top_k is not None and top_k < len(p):
        keep = set(order[:top_k])
        p = np.array([v if i in keep else 0.0 for i, v in enumerate(p)])
        p /= p.sum()
    if top_p < 1.0:
        kept, mass = set(), 0.0
        for i in order:  # the smallest set of most likely tokens whose mass reaches top_p
            if mass >= top_p:
                break
            kept.add(i)
            mass += p[i]
        p = np.array([v if i in kept else 0.0 for i, v in enumerate(p)])
        p /= p.sum()
    return p


def penalised(
    logits, prompt: list[int], output: list[int], repetition: float = 1.0, presence: float = 0.0,
    frequency: float = 0.0, bias: dict[int, float] | None = None,
) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64).copy()
    for t, b in (bias or {}).items():
        x[t] += b
    seen = set(prompt) | set(output)
    for t in seen:
        x[t] = x[t] / repetition if x[t] > 0 else x[t] * repetition
    for t, c in Counter(output).items():
        x[t] -= frequency * c + presence
    return x
