"""The whole-layer decode call's attention (``csrc/decode_layer.c``: one work item per sequence and
KV head, ``es_decode_attention_kv``) against the per-op path's decode kernel (one item per query
head, ``es_decode_attention_f32``), bit for bit, on the shapes that reach every branch: several
cache blocks of 16 positions (the eight-keys-at-once scores), head groups of 1-4 (AVX-512 head
pairs and a single head beside them), head_dim 64 and 40 (a tail after the 8-lane chunks), 1 and
2 threads, a batch of sequences of different lengths; and the same with a bf16 KV pool (bf16
attention): the layer's own rounding of each new K/V row equals torch's, and its attention
over the widened rows equals the per-op kernel's."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import with_threads

import execstate.model.transformer as transformer
from execstate.model.context import StepContext
from execstate.model.loader import load_model
from execstate.model.paged_attention import PagedAttention, SeqSpan
from execstate.model.random_models import make_random
from execstate.state.kv_pool import KVPool

BS = 16
LENS = [3, 40, 17, 129, 64]


def _model(tmp_path, heads: int, kv_heads: int, head_dim: int):
    path = make_random("llama", tmp_path, seed=7, hidden_size=heads * head_dim, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=256)
    model = load_model(path)
    model.use_cpu_kernels(True)
    assert model.decode_weights().reason is None
    return model


def _prefill(model, kv_dtype=torch.float32):
    cfg = model.config
    blocks = sum(-(-(n + 1) // BS) for n in LENS) + 4
    pool = KVPool(cfg.num_layers, blocks, BS, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(1)).tolist()
    gen = torch.Generator().manual_seed(2)
    tables, tokens, at = [], [], 0
    for n in LENS:
        k = -(-(n + 1) // BS)
        tables.append(perm[at : at + k])
        at += k
        tokens.append(torch.randint(3, cfg.vocab_size, (n + 1,), generator=gen))
        att = PagedAttention(pool, [SeqSpan(0, n, n, tables[-1])], use_kernels=True)
        with torch.inference_mode(), StepContext(torch.arange(n), att) as ctx:
            model(tokens[-1][:n], ctx)
    return pool, tables, tokens


def _step(model, pool, tables, tokens) -> torch.Tensor:
    spans = [SeqSpan(i, 1, n + 1, tables[i]) for i, n in enumerate(LENS)]
    att = PagedAttention(pool, spans, use_kernels=True)
    ids = torch.stack([tokens[i][n] for i, n in enumerate(LENS)])
    with torch.inference_mode(), StepContext(torch.tensor(LENS), att) as ctx:
        return model(ids, ctx)


def _per_op_step(model, pool, tables, tokens) -> torch.Tensor:
    """``_step`` on the per-op path (the whole-layer call switched off)."""
    real = transformer.decode_layers
    transformer.decode_layers = lambda *a, **k: None
    try:
        return _step(model, pool, tables, tokens)
    finally:
        transformer.decode_layers = real


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 4, 64), (4, 2, 64), (6, 2, 64), (8, 2, 64),
                                                             (6, 2, 40), (4, 1, 40)])
def test_kv_items_equal_the_per_head_kernel(tmp_path, heads, kv_heads, head_dim) -> None:
    model = _model(tmp_path, heads, kv_heads, head_dim)
    pool, tables, tokens = _prefill(model)
    fast = {n: with_threads(n, lambda: _step(model, pool, tables, tokens)) for n in (1, 2)}
    slow = _per_op_step(model, pool, tables, tokens)
    assert torch.equal(fast[1], slow)
    assert torch.equal(fast[2], slow)


def _copy(pool: KVPool) -> KVPool:
    c = KVPool(pool.k.shape[0], pool.num_blocks, pool.block_size, pool.k.shape[2], pool.k.shape[3], pool.k.dtype)
    c.k.copy_(pool.k)
    c.v.copy_(pool.v)
    return c


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 64), (6, 2, 64), (6, 2, 40), (4, 1, 40)])
def test_bf16_pool_layer_equals_the_per_op_path(tmp_path, heads, kv_heads, head_dim) -> None:
    model = _model(tmp_path, heads, kv_heads, head_dim)
    pool, tables, tokens = _prefill(model, torch.bfloat16)
    assert pool.k.dtype is torch.bfloat16
    pools = {n: _copy(pool) for n in (1, 2)}
    fast = {n: with_threads(n, lambda n=n: _step(model, pools[n], tables, tokens)) for n in (1, 2)}
    slow = _per_op_step(model, pool, tables, tokens)
    assert torch.equal(fast[1], slow) and torch.equal(fast[2], slow)
    # the layer's own rounding of the step's new K/V (bf16_rne) == torch's fp32 -> bf16 in the per-op path
    for n in (1, 2):
        assert torch.equal(pools[n].k.view(torch.int16), pool.k.view(torch.int16))
        assert torch.equal(pools[n].v.view(torch.int16), pool.v.view(torch.int16))
    # and bf16 storage is not fp32 storage: the same step on an fp32 pool gives other bits
    fp32_pool, _, _ = _prefill(model)
    assert not torch.equal(_step(model, fp32_pool, tables, tokens), slow)
