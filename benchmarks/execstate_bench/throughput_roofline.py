"""The memory-bandwidth roofline of decode: the tok/s a batch of ``B`` sequences cannot exceed
when every decode step has to read its weights from memory once.

    ceiling(B) = B x bandwidth / bytes read per step(B)

Bytes per step (``step_bytes``), from the safetensors headers (shapes only) and
``bytes_per_weight`` (4 for fp32, 2 for bf16), or from a GGUF file's tensors as stored
(``gguf_weight_bytes``): every weight once, except

- the input embedding: ``B`` rows (a lookup), unless tied to the LM head (then read once, whole,
  by the head);
- MoE experts (tensors under ``.experts.``): only the experts the batch routes to. With ``E``
  experts of which each token picks ``k`` distinct ones, uniformly (``expected_experts_read``),
  a layer reads ``E x (1 - (1 - k/E)^B)`` experts in expectation: top-2 of 8 reads 2 at batch 1,
  5.4 at batch 4, 7.2 at batch 8, 7.9 at batch 16. Routing of a real model is not uniform,
  which makes fewer experts read; this is the assumption the ceiling rests on.

The KV cache read by attention is not counted (``kv_bytes_per_token`` gives its size for a
note: at a few hundred tokens of context it is small next to the weights).

``measure_bandwidth``: the machine's memory read bandwidth, best of ``repeats`` sums of a
tensor far larger than the caches, with 1..``threads`` torch threads (also a copy's bandwidth,
read + write bytes, for reference).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of the weights by how a decode step reads them (``bytes_per_weight`` each)."""

    dense: int  # read whole every step
    embedding: int  # the untied input embedding table (``B`` rows read per step)
    embedding_row: int  # one of its rows
    experts: int  # all MoE experts of all layers
    num_experts: int | None
    top_k: int | None


def expected_experts_read(num_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts per layer that ``batch`` tokens route to, each picking ``top_k``
    distinct experts of ``num_experts`` uniformly at random."""
    if not (1 <= top_k <= num_experts) or batch < 0:
        raise ValueError(f"need 1 <= top_k ({top_k}) <= num_experts ({num_experts}) and batch >= 0")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def weight_bytes(model_dir: Path, bytes_per_weight: int = 4) -> WeightBytes:
    """Sort the stored weights of ``model_dir`` (safetensors headers) by how decode reads them."""
    import json

    from safetensors import safe_open

    cfg = json.loads((model_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    dense = emb = row = experts = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                shape = sf.get_slice(name).get_shape()
                n = int(np.prod(shape)) * bytes_per_weight
                if ".experts." in name:
                    experts += n
                elif name.endswith("embed_tokens.weight") and not tied:
                    emb, row = n, int(shape[-1]) * bytes_per_weight
                elif name == "lm_head.weight" and tied:
                    continue  # the tied head is the embedding table, counted once
                else:
                    dense += n
    e = cfg.get("num_experts") or cfg.get("num_local_experts")
    k = cfg.get("num_experts_per_tok")
    return WeightBytes(dense, emb, row, experts, int(e) if e else None, int(k) if k else None)


def gguf_weight_bytes(gguf_path: Path, model_dir: Path) -> WeightBytes:
    """``weight_bytes`` of a model served from the GGUF file ``gguf_path`` (its tensors' bytes as
    stored: blocks, and fp32 for float tensors, which the engine widens to fp32); ``model_dir``'s
    config.json gives the tying and routing."""
    import json

    from execstate.model.gguf_file import read_tensors
    from execstate.model.gguf_import import hf_tensor_name

    cfg = json.loads((model_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    meta, tensors = read_tensors(gguf_path)
    llama = meta.get("general.architecture") == "llama"
    dense = emb = row = experts = 0
    for t in tensors:
        name = hf_tensor_name(t.name) if llama else t.name
        n = t.data.nbytes * (2 if t.kind in ("F16", "BF16") else 1)  # float tensors become fp32
        if ".experts." in name:
            experts += n
        elif name.endswith("embed_tokens.weight") and not tied:
            emb, row = n, n // int(t.shape[0])
        else:
            dense += n
    e = cfg.get("num_experts") or cfg.get("num_local_experts")
    k = cfg.get("num_experts_per_tok")
    return WeightBytes(dense, emb, row, experts, int(e) if e else None, int(k) if k else None)


def step_bytes(w: WeightBytes, batch: int) -> float:
    """Expected weight bytes one decode step of ``batch`` sequences reads."""
    total = float(w.dense + min(batch * w.embedding_row, w.embedding))
    if w.experts:
        if w.num_experts is None or w.top_k is None:
            total += w.experts  # experts without a routing config: count them all
        else:
            total += w.experts * expected_experts_read(w.num_experts, w.top_k, batch) / w.num_experts
    return total


def ceiling_tok_s(w: WeightBytes, batch: int, bandwidth_bytes_s: float) -> float:
    """The decode tok/s ceiling at ``batch``: batch x bandwidth / bytes per step."""
    return batch * bandwidth_bytes_s / step_bytes(w, batch)


def kv_bytes_per_token(cfg: dict[str, Any], bytes_per_value: int = 4) -> int:
    """KV cache bytes of one token over all layers (K and V)."""
    heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * int(cfg["num_hidden_layers"]) * heads * head_dim * bytes_per_value


def roofline(model_dir: Path, batches: list[int], bandwidth_bytes_s: float | dict[int, float],
             bytes_per_weight: int = 4, weights: WeightBytes | None = None) -> dict[str, Any]:
    """The roofline of ``model_dir`` at each batch size (JSON-ready). ``bandwidth_bytes_s``: one
    figure for every batch size, or one per batch size (the bandwidth measured next to that batch
    size's runs: this shared machine's bandwidth moves by tens of percent within minutes);
    ``bandwidth_gb_s`` is then their median and ``bandwidth_gb_s_by_batch`` each one. ``weights``:
    the bytes of another storage format (e.g. ``gguf_weight_bytes``) instead of
    ``bytes_per_weight`` times the safetensors' weights."""
    w = weights or weight_bytes(model_dir, bytes_per_weight)
    per = bandwidth_bytes_s if isinstance(bandwidth_bytes_s, dict) else {b: bandwidth_bytes_s for b in batches}
    missing = [b for b in batches if b not in per]
    if missing:
        raise ValueError(f"roofline: no bandwidth for batch sizes {missing}")
    out = {
        "bandwidth_gb_s": float(np.median([per[b] for b in batches])) / 1e9 if batches else 0.0,
        "bytes_per_weight": bytes_per_weight,
        "weights": asdict(w),
        "routing_assumption": "each token picks top_k distinct experts uniformly at random",
        "by_batch": {str(b): {"step_bytes": step_bytes(w, b), "ceiling_tok_s": ceiling_tok_s(w, b, per[b]),
                              "bandwidth_gb_s": per[b] / 1e9,
                              "experts_read_per_layer": None if not (w.num_experts and w.top_k)
                              else expected_experts_read(w.num_experts, w.top_k, b)} for b in batches},
    }
    if isinstance(bandwidth_bytes_s, dict):
        out["bandwidth_gb_s_by_batch"] = {str(b): per[b] / 1e9 for b in batches}
    return out


def measure_bandwidth(size_mib: int = 512, repeats: int = 5, threads: int = 1) -> dict[str, Any]:
    """Memory bandwidth in bytes/s: ``read`` (sum of a ``size_mib`` MiB fp32 tensor) and ``copy``
    (read + write bytes of copying it), best of ``repeats`` runs with each torch thread count
    from 1 to ``threads`` (on a shared machine fewer threads can get more of the memory);
    ``by_threads`` has each count's figures. Restores torch's thread count."""
    import torch

    before = torch.get_num_threads()
    n = size_mib * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    by_threads: dict[str, dict[str, float]] = {}
    try:
        for t in range(1, max(1, threads) + 1):
            torch.set_num_threads(t)
            read = copy = 0.0
            src.sum()
            for _ in range(repeats):
                t0 = time.perf_counter()
                src.sum()
                read = max(read, 4 * n / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                dst.copy_(src)
                copy = max(copy, 8 * n / (time.perf_counter() - t0))
            by_threads[str(t)] = {"read": read, "copy": copy}
    finally:
        torch.set_num_threads(before)
    return {"read": max(v["read"] for v in by_threads.values()), "copy": max(v["copy"] for v in by_threads.values()),
            "size_mib": size_mib, "repeats": repeats, "by_threads": by_threads}
