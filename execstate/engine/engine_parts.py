"""What an engine is built from, made from its ``EngineConfig``: the loaded model and tokenizer,
the KV pool and its size in blocks, the route store, and the provenance its blocks are keyed under.

``EngineParts.build(config)`` does, in this order: resolve and load the model in its numerics
mode (``engine/model_numerics.py``: fp32, bf16 weights, bf16 arithmetic or GGUF blocks; fp32
activations and KV cache when weights are stored in bf16, a bf16 KV cache with
``kv_cache_dtype="bfloat16"``; the CPU kernels on or off), bound
``max_model_len`` by the model's, size the KV pool (``num_kv_blocks``, else as many blocks as
``kv_cache_memory_bytes`` holds but never more than ``max_num_seqs`` full-length sequences use;
``ValueError`` when one ``max_model_len`` sequence does not fit), start mapping its pages
(``prefault_kv``), build the route store (MoE models with route return only) and the provenance
(weights digest, dtype, the numerics id of the mode and kernels in use, the engine-wide cache
salt). ``LLMEngine`` builds the rest: the connectors, then the block pool with its eviction hooks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from execstate.engine.config import EngineConfig
from execstate.engine.model_numerics import kv_cache_dtype, load_engine_model, numerics_id
from execstate.engine.tokenizer import Tokenizer
from execstate.identity.provenance import Provenance
from execstate.kernels.paged_decode import MAX_TILED_GROUP
from execstate.model.registry import resolve_model
from execstate.model.transformer import CausalLM
from execstate.model.weights_digest import model_digest
from execstate.state.kv_pool import KVPool
from execstate.state.route_store import RouteStore


@dataclass
class EngineParts:
    model_path: Path
    model: CausalLM
    tokenizer: Tokenizer | None
    max_model_len: int
    kv_pool: KVPool
    kv_populate: threading.Thread | None  # prefault_kv: the thread mapping the pool's pages
    return_routes: bool
    route_store: RouteStore | None
    num_blocks: int  # the KV pool's blocks (the block pool's size)
    provenance: Provenance

    @classmethod
    def build(cls, config: EngineConfig) -> EngineParts:
        model_path = resolve_model(config.model)
        kv_dtype = kv_cache_dtype(config)  # the KV pool's (bf16 attention: bf16; else the activations')
        model = load_engine_model(model_path, config)  # in its numerics mode (engine/model_numerics.py)
        mc = model.config
        if kv_dtype is torch.bfloat16 and mc.num_heads // mc.num_kv_heads > MAX_TILED_GROUP:
            raise ValueError(f"kv_cache_dtype='bfloat16' takes at most {MAX_TILED_GROUP} query heads per KV head; "
                             f"this model has {mc.num_heads // mc.num_kv_heads}")
        tokenizer = Tokenizer(model_path, config.chat_template) if (model_path / "tokenizer.json").exists() else None
        if tokenizer is None and config.chat_template is not None:
            raise ValueError(f"chat_template: the model at {model_path} has no tokenizer.json to render chats with")
        max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        bpb = KVPool.bytes_per_block(mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, kv_dtype)
        min_blocks = -(-max_model_len // config.block_size)
        # Never allocate more than max_num_seqs full-length sequences could ever use.
        num_blocks = config.num_kv_blocks or max(
            1, min(config.kv_cache_memory_bytes // bpb, config.max_num_seqs * min_blocks)
        )
        if num_blocks < min_blocks:
            raise ValueError(
                f"KV pool of {num_blocks} blocks cannot hold one max_model_len={max_model_len} "
                f"sequence ({min_blocks} blocks); raise kv_cache_memory_bytes/num_kv_blocks or lower max_model_len"
            )
        kv_pool = KVPool(
            mc.num_layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, kv_dtype, config.device
        )
        kv_populate = kv_pool.populate_async() if config.prefault_kv else None
        return_routes = config.enable_return_routed_experts and mc.is_moe
        route_store = (
            RouteStore(config.block_size, mc.num_moe_layers, mc.top_k, mc.num_experts) if return_routes else None
        )
        provenance = Provenance(
            model_id=str(config.model),
            weights_version=model_digest(model),
            dtype=config.dtype,
            numerics=numerics_id(config, model),
        )
        return cls(model_path, model, tokenizer, max_model_len, kv_pool, kv_populate, return_routes, route_store,
                   num_blocks, provenance)
