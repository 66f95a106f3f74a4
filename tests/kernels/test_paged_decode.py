"""Decode attention on the paged KV cache (execstate.kernels.paged_decode.PagedDecode) and the
``PagedAttention`` layer that uses it.

Oracles: an explicit float64 softmax over each sequence's gathered K/V; torch SDPA on the
same gathered K/V (the torch decode path of ``PagedAttention``); ``PagedAttention`` with
``use_kernels=False`` on an identical pool; the kernel's contract: per (sequence, query
head) work items, so a sequence's output does not depend on the others or on the thread count.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu
from execstate.model.paged_attention import PagedAttention, SeqSpan
from execstate.state.kv_pool import KVPool

PARALLEL_MIN_MACS = (
    65536  # csrc/simd.h, attention.c: decode attention goes parallel at B * nh * max(ctx_len) * d >= this
)


def _tables(ctx_lens: list[int], bs: int, num_blocks: int, seed: int, spare: int = 0) -> list[list[int]]:
    """Per sequence, ceil(ctx_len / bs) (+ ``spare`` unused) distinct block ids drawn from a
    random permutation: non-contiguous, out of order."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, at = [], 0
    for n in ctx_lens:
        k = -(-n // bs) + spare
        tables.append(perm[at : at + k])
        at += k
    assert at <= num_blocks
    return tables


def _slots(table: list[int], n: int, bs: int) -> torch.Tensor:
    return torch.tensor([table[pos // bs] * bs + pos % bs for pos in range(n)], dtype=torch.long)


def _reference_f64(q, kc, vc, tokens, tables, ctx_lens, bs, scale) -> dict[int, torch.Tensor]:
    """out row -> [nh, d] float64: explicit softmax over the gathered context, head j on KV head j // G."""
    nh, nkv = q.shape[1], kc.shape[1]
    out = {}
    for tok, table, n in zip(tokens, tables, ctx_lens, strict=True):
        slots = _slots(table, n, bs)
        k = kc[slots].double().repeat_interleave(nh // nkv, dim=1)  # [L, nh, d]
        v = vc[slots].double().repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[tok].double(), k) * scale
        p = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        p = p / p.sum(dim=-1, keepdim=True)
        out[tok] = torch.einsum("hl,lhd->hd", p, v)
    return out


def _reference_sdpa(q, kc, vc, tokens, tables, ctx_lens, bs, scale) -> dict[int, torch.Tensor]:
    out = {}
    for tok, table, n in zip(tokens, tables, ctx_lens, strict=True):
        slots = _slots(table, n, bs)
        qd = q[tok][:, None]  # [nh, 1, d]
        kd, vd = kc[slots].transpose(0, 1), vc[slots].transpose(0, 1)  # [nkv, L, d]
        out[tok] = F.scaled_dot_product_attention(qd, kd, vd, scale=scale, enable_gqa=True)[:, 0]
    return out


def _run(tokens, tables, ctx_lens, bs, q, kc, vc, scale, fill: float = 12345.0) -> torch.Tensor:
    out = torch.full_like(q, fill)
    cpu.PagedDecode(tokens, tables, ctx_lens, bs, kc.shape[0]).run(q, kc, vc, out, scale)
    return out


def _check(out, q, kc, vc, tokens, tables, ctx_lens, bs, scale, fill: float = 12345.0) -> None:
    f64 = _reference_f64(q, kc, vc, tokens, tables, ctx_lens, bs, scale)
    sdpa = _reference_sdpa(q, kc, vc, tokens, tables, ctx_lens, bs, scale)
    for tok in tokens:
        torch.testing.assert_close(out[tok].double(), f64[tok], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[tok], sdpa[tok], rtol=1e-5, atol=1e-5)
    others = [r for r in range(q.shape[0]) if r not in set(tokens)]
    assert bool((out[others] == fill).all()), "rows of no decode sequence were written"


GEOMETRY = [(4, 4, 64), (8, 4, 16), (8, 2, 64), (4, 1, 16), (6, 3, 12)]  # groups 1, 2, 4, 4, 2; d % 8 != 0


@pytest.mark.parametrize(("nh", "nkv", "d"), GEOMETRY)
@pytest.mark.parametrize("batch", [1, 5])
def test_paged_decode_matches_references(nh: int, nkv: int, d: int, batch: int) -> None:
    bs, num_blocks, t = 16, 24, 13
    # ctx 1, a partial block, an exact block, one past a block, a long context with a partial tail.
    ctx_lens = [40, 1, 16, 17, 7][:batch]
    tokens = [9, 2, 12, 0, 5][:batch]  # scattered rows of a 13-token flat batch
    tables = _tables(ctx_lens, bs, num_blocks, seed=nh + d + batch)
    kc, vc = randn(num_blocks * bs, nkv, d, seed=1), randn(num_blocks * bs, nkv, d, seed=2)
    q = randn(t, nh, d, seed=3)
    scale = d**-0.5
    out = _run(tokens, tables, ctx_lens, bs, q, kc, vc, scale)
    _check(out, q, kc, vc, tokens, tables, ctx_lens, bs, scale)


def test_paged_decode_ctx_len_one_returns_that_value_row() -> None:
    kc, vc = randn(32, 2, 16, seed=4), randn(32, 2, 16, seed=5)
    q = randn(1, 4, 16, seed=6) * 100.0
    out = _run([0], [[1]], [1], 8, q, kc, vc, 0.25)
    # softmax over one position is exactly 1: the output is V at slot 8 (block 1, offset 0).
    assert torch.equal(out[0], vc[8].repeat_interleave(2, dim=0))


@pytest.mark.parametrize("bs", [1, 3, 16])
def test_paged_decode_block_sizes_spare_blocks_and_shared_blocks(bs: int) -> None:
    nh, nkv, d, num_blocks = 4, 2, 16, 120
    ctx_lens = [23, 9, 30]
    tables = _tables(ctx_lens, bs, num_blocks, seed=bs, spare=1)  # one unused block past each context
    tables.append(tables[0][:2] + tables[1][2:])  # prefix blocks shared with sequence 0 (prefix cache)
    ctx_lens.append(min(2 * bs + 1, len(tables[3]) * bs))
    kc, vc = randn(num_blocks * bs, nkv, d, seed=7), randn(num_blocks * bs, nkv, d, seed=8)
    tokens = [3, 1, 0, 6]
    q = randn(7, nh, d, seed=9)
    out = _run(tokens, tables, ctx_lens, bs, q, kc, vc, 0.3)  # a non-default scale
    _check(out, q, kc, vc, tokens, tables, ctx_lens, bs, 0.3)


def test_paged_decode_large_scores_are_stable() -> None:
    """Scores of several hundred: the softmax must subtract the max (no inf/NaN)."""
    nh, nkv, d, bs = 4, 2, 64, 16
    ctx_lens = [37, 300]
    tables = _tables(ctx_lens, bs, 40, seed=10)
    kc, vc = randn(40 * bs, nkv, d, seed=11) * 10.0, randn(40 * bs, nkv, d, seed=12)
    q = randn(2, nh, d, seed=13) * 10.0
    out = _run([1, 0], tables, ctx_lens, bs, q, kc, vc, d**-0.5)
    assert torch.isfinite(out).all()
    f64 = _reference_f64(q, kc, vc, [1, 0], tables, ctx_lens, bs, d**-0.5)
    for tok in (0, 1):
        torch.testing.assert_close(out[tok].double(), f64[tok], rtol=1e-4, atol=1e-4)


def test_paged_decode_is_batch_invariant_bitwise() -> None:
    nh, nkv, d, bs, num_blocks = 8, 2, 64, 16, 40
    ctx_lens = [40, 1, 16, 17, 200]
    tokens = [4, 0, 7, 2, 5]
    tables = _tables(ctx_lens, bs, num_blocks, seed=14)
    kc, vc = randn(num_blocks * bs, nkv, d, seed=15), randn(num_blocks * bs, nkv, d, seed=16)
    q = randn(8, nh, d, seed=17)
    together = _run(tokens, tables, ctx_lens, bs, q, kc, vc, d**-0.5)
    for b in range(5):
        alone = _run([tokens[b]], [tables[b]], [ctx_lens[b]], bs, q, kc, vc, d**-0.5)
        assert torch.equal(alone[tokens[b]], together[tokens[b]]), f"sequence {b} depends on its batch"
        # ... and on which row of the flat batch its query sits in.
        q1 = q[tokens[b] : tokens[b] + 1].contiguous()
        assert torch.equal(_run([0], [tables[b]], [ctx_lens[b]], bs, q1, kc, vc, d**-0.5)[0], together[tokens[b]])
    # The reverse order of sequences changes nothing either.
    rev = _run(tokens[::-1], tables[::-1], ctx_lens[::-1], bs, q, kc, vc, d**-0.5)
    assert torch.equal(rev, together)


def test_paged_decode_same_bits_with_one_or_two_threads() -> None:
    nh, nkv, d, bs, num_blocks = 8, 2, 64, 16, 48
    ctx_lens = [300, 5, 77, 16, 129]
    assert len(ctx_lens) * nh * max(ctx_lens) * d >= PARALLEL_MIN_MACS
    tokens = [0, 1, 2, 3, 4]
    tables = _tables(ctx_lens, bs, num_blocks, seed=18)
    kc, vc = randn(num_blocks * bs, nkv, d, seed=19), randn(num_blocks * bs, nkv, d, seed=20)
    q = randn(5, nh, d, seed=21)
    before = torch.get_num_threads()
    one = with_threads(1, lambda: _run(tokens, tables, ctx_lens, bs, q, kc, vc, d**-0.5))
    two = with_threads(2, lambda: _run(tokens, tables, ctx_lens, bs, q, kc, vc, d**-0.5))
    assert torch.get_num_threads() == before
    assert torch.equal(one, two)
    _check(two, q, kc, vc, tokens, tables, ctx_lens, bs, d**-0.5)


def test_paged_decode_no_sequences_writes_nothing() -> None:
    kc = randn(32, 2, 16, seed=22)
    q = randn(3, 4, 16, seed=23)
    out = _run([], [], [], 8, q, kc, kc, 0.25)
    assert bool((out == 12345.0).all())


def test_paged_decode_bad_plan_is_a_value_error() -> None:
    bs, slots = 16, 8 * 16  # 8 blocks
    good = dict(tokens=[0, 1], block_tables=[[3, 5], [7]], ctx_lens=[20, 16], block_size=bs, num_slots=slots)
    cases = [
        (dict(block_tables=[[3, 8], [7]]), r"sequence 0 has a block id outside \[0, 8\)"),
        (dict(block_tables=[[3, 5], [-1]]), r"sequence 1 has a block id outside \[0, 8\)"),
        (dict(block_tables=[[3, 5], [1 << 40]]), r"sequence 1 has a block id outside"),
        (dict(num_slots=7 * 16 + 15), r"sequence 1 has a block id outside \[0, 7\)"),  # a partial 8th block
        (dict(ctx_lens=[20, 0]), "sequence 1 has ctx_len 0 for 1 blocks of 16"),
        (dict(ctx_lens=[-3, 16]), "sequence 0 has ctx_len -3"),
        (dict(ctx_lens=[33, 16]), "sequence 0 has ctx_len 33 for 2 blocks of 16"),
        (dict(ctx_lens=[20, 17]), "sequence 1 has ctx_len 17 for 1 blocks of 16"),
        (dict(block_tables=[[3, 5], []]), "sequence 1 has ctx_len 16 for 0 blocks"),
        (dict(tokens=[0]), "one entry per sequence"),
        (dict(ctx_lens=[20]), "one entry per sequence"),
        (dict(block_tables=[[3, 5], [7], [1]]), "one entry per sequence"),
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(tokens=[0, -1]), "token rows must be >= 0"),
    ]
    cpu.PagedDecode(**good)
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.PagedDecode(**{**good, **change})


def test_paged_decode_bad_tensors_are_value_errors_and_write_nothing() -> None:
    nh, nkv, d, bs, slots = 4, 2, 16, 16, 8 * 16
    plan = cpu.PagedDecode([0, 2], [[3, 5], [7]], [20, 16], bs, slots)
    q, kc, vc = randn(3, nh, d, seed=24), randn(slots, nkv, d, seed=25), randn(slots, nkv, d, seed=26)
    out = torch.full_like(q, 7.0)
    good = dict(q=q, k_cache=kc, v_cache=vc, out=out)
    cases = [
        (dict(q=q[:2].contiguous(), out=out[:2].contiguous()), "token row 2 outside a batch of 2"),
        (dict(k_cache=kc[:-16].contiguous(), v_cache=vc[:-16].contiguous()), r"expected 128 slots"),
        (dict(k_cache=torch.cat([kc, kc[:16]]), v_cache=torch.cat([vc, vc[:16]])), r"expected 128 slots"),
        (dict(v_cache=vc[:-1].contiguous()), "inconsistent shapes"),
        (dict(out=out[:, :2].contiguous()), "inconsistent shapes"),
        (dict(q=q[..., :8].contiguous(), out=out[..., :8].contiguous()), "inconsistent shapes"),
        (dict(q=randn(3, 3, d, seed=27), out=torch.zeros(3, 3, d)), "inconsistent shapes"),  # 3 % 2 heads
        (dict(q=q.double()), "q must be a contiguous float32"),
        (dict(out=out.bfloat16()), "out must be a contiguous float32"),
        (dict(k_cache=kc.half()), "k_cache must be a contiguous float32"),
        (dict(v_cache=vc.transpose(1, 2).contiguous().transpose(1, 2)), r"v_cache must be .*non-contiguous"),
        (dict(q=q.transpose(0, 1).contiguous().transpose(0, 1)), r"q must be .*non-contiguous"),
        (dict(out=out[None]), "out must be a 3-D tensor"),
        (dict(k_cache=kc.view(slots, nkv * d)), "k_cache must be a 3-D tensor"),
        (dict(q=torch.zeros(3, nh, 0), out=torch.zeros(3, nh, 0), k_cache=torch.zeros(slots, nkv, 0),
              v_cache=torch.zeros(slots, nkv, 0)), "decode_attention: bad sizes"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            plan.run(**{**good, **change}, scale=0.25)
    assert bool((out == 7.0).all())
    plan.run(q, kc, vc, out, 0.25)  # still usable
    _check(out, q, kc, vc, [0, 2], [[3, 5], [7]], [20, 16], bs, 0.25, fill=7.0)


def test_paged_decode_zero_kv_heads_is_a_value_error() -> None:
    """Caches with 0 KV heads: a ValueError from the shape check, not a ZeroDivisionError."""
    plan = cpu.PagedDecode([0], [[1]], [4], 4, 16)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        plan.run(torch.zeros(1, 4, 8), torch.zeros(16, 0, 8), torch.zeros(16, 0, 8), torch.zeros(1, 4, 8), 1.0)


# ------------------------------------------------------------------------------- the layer


def _spans() -> list[SeqSpan]:
    """A mixed step over a 2-layer pool of 16 blocks of 4 (flat batch of 13 tokens): decode
    spans with a partial last block, an exactly full block and a 2-token context; a fresh
    prefill; a prefill continuing a cached context (chunked prefill / prefix hit)."""
    return [
        SeqSpan(token_start=0, num_query=1, context_len=10, block_ids=[7, 2, 12]),  # decode, pos 9
        SeqSpan(token_start=1, num_query=5, context_len=5, block_ids=[0, 9]),  # fresh prefill
        SeqSpan(token_start=6, num_query=1, context_len=8, block_ids=[5, 14, 3]),  # decode, fills block 14
        SeqSpan(token_start=7, num_query=3, context_len=7, block_ids=[11, 4]),  # prefill after 4 cached
        SeqSpan(token_start=10, num_query=1, context_len=2, block_ids=[15]),  # decode, 1 cached token
        SeqSpan(token_start=11, num_query=1, context_len=1, block_ids=[1]),  # one-token fresh prefill
        SeqSpan(token_start=12, num_query=1, context_len=13, block_ids=[8, 6, 10, 13]),  # decode
    ]


@pytest.mark.parametrize(("nh", "nkv", "d"), [(8, 2, 16), (4, 4, 64), (4, 1, 12)])
def test_paged_attention_kernel_vs_torch_on_the_same_pool(nh: int, nkv: int, d: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    real_run = cpu.PagedDecode.run
    monkeypatch.setattr(cpu.PagedDecode, "run", lambda self, q, *a: runs.append(self.num_seqs) or real_run(self, q, *a))
    layers, blocks, bs, t = 2, 16, 4, 13
    pools = [KVPool(layers, blocks, bs, nkv, d, torch.float32) for _ in range(2)]
    # Cached context: random K/V in every slot (slots past a context must not matter either).
    init_k, init_v = randn(layers, blocks * bs, nkv, d, seed=30), randn(layers, blocks * bs, nkv, d, seed=31)
    for pool in pools:
        pool.k.copy_(init_k)
        pool.v.copy_(init_v)
    spans = _spans()
    torch_attn = PagedAttention(pools[0], spans, use_kernels=False)
    kern_attn = PagedAttention(pools[1], spans, use_kernels=True)
    assert torch_attn.paged_decode is None and torch_attn.decode_tokens is not None
    assert kern_attn.paged_decode is not None and kern_attn.decode_tokens is None
    # Every query row (decode and prefill) runs the kernel on the block tables.
    assert kern_attn.paged_decode.num_seqs == t and len(kern_attn.prefills) == 0
    for layer in range(layers):
        q = randn(t, nh, d, seed=40 + layer)
        k, v = randn(t, nkv, d, seed=50 + layer), randn(t, nkv, d, seed=60 + layer)
        inputs = [x.clone() for x in (q, k, v)]
        ref = torch_attn.forward(layer, q, k, v)
        got = kern_attn.forward(layer, q, k, v)
        assert all(torch.equal(a, b) for a, b in zip(inputs, (q, k, v), strict=True)), "inputs modified"
        assert got.shape == ref.shape == (t, nh, d)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        # Every row against the float64 reference on the pool as written this step (query i of
        # a span sees its context up to and including its own position).
        rows = [(s.token_start + i, s.block_ids, s.context_len - s.num_query + i + 1)
                for s in spans for i in range(s.num_query)]
        f64 = _reference_f64(q, pools[1].k[layer], pools[1].v[layer], [r[0] for r in rows],
                             [r[1] for r in rows], [r[2] for r in rows], bs, d**-0.5)
        assert len(f64) == t
        for tok, want in f64.items():
            torch.testing.assert_close(got[tok].double(), want, rtol=1e-5, atol=1e-5)
    assert runs == [t] * layers
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    # The step wrote its new tokens' K/V (and nothing else) into the pool.
    changed = (pools[1].k != init_k).any(dim=(2, 3))  # [layers, slots]
    written = torch.zeros(blocks * bs, dtype=torch.bool)
    for s in spans:
        written[_slots(s.block_ids, s.context_len, bs)[s.context_len - s.num_query :]] = True
    assert torch.equal(changed, written.expand(layers, -1))
    assert bool(torch.isfinite(got).all())


@pytest.mark.parametrize("chunks", [[10], [4, 3, 3], [1] * 10, [9, 1]])
def test_prefill_rows_are_the_same_bits_however_the_prompt_is_split(chunks: list[int]) -> None:
    """A 10-token prompt prefilled in one span, in chunks over several steps (chunked prefill,
    a prefix hit) or token by token (decode) gives every row the same attention output, bit
    for bit: each query row is one kernel call over its own context (PagedDecode.for_spans)."""
    nh, nkv, d, bs, n = 4, 2, 16, 4, 10
    q, k, v = randn(n, nh, d, seed=1), randn(n, nkv, d, seed=2), randn(n, nkv, d, seed=3)
    table = [5, 2, 7]

    def run(splits: list[int]) -> torch.Tensor:
        pool = KVPool(1, 8, bs, nkv, d, torch.float32)
        outs, done = [], 0
        for c in splits:
            # the same span in a batch behind another request's 3-token prefill (rows 0..2)
            other = SeqSpan(token_start=0, num_query=3, context_len=3, block_ids=[0])
            span = SeqSpan(token_start=3, num_query=c, context_len=done + c, block_ids=table)
            attn = PagedAttention(pool, [other, span], use_kernels=True)
            pad = randn(3, nh, d, seed=9), randn(3, nkv, d, seed=10), randn(3, nkv, d, seed=11)
            out = attn.forward(0, torch.cat([pad[0], q[done : done + c]]), torch.cat([pad[1], k[done : done + c]]),
                               torch.cat([pad[2], v[done : done + c]]))
            outs.append(out[3:])
            done += c
        return torch.cat(outs)

    whole = run([n])
    assert torch.equal(run(chunks), whole)
    ref = PagedAttention(KVPool(1, 8, bs, nkv, d, torch.float32),
                         [SeqSpan(token_start=0, num_query=n, context_len=n, block_ids=table)], use_kernels=False)
    torch.testing.assert_close(whole, ref.forward(0, q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tiled_prefill_of_uneven_spans_writes_every_row_once_on_any_team(threads: int) -> None:
    """The tiled kernel's work items are split in shares, one per thread, each thread taking its
    own in order and then the others' (csrc/prefill_attention.c): with spans of very different
    lengths (one long prompt, short chunks after cached context, decodes) on 1-3 threads every
    query row is computed, once, the bits of the decode kernel (one row at a time)."""
    nh, nkv, d, bs = 8, 4, 64, 16
    # (new tokens, context after the step)
    shapes = [(300, 300), (3, 40), (1, 17), (37, 37), (1, 1), (12, 100), (64, 64)]
    starts = [sum(n for n, _ in shapes[:i]) for i in range(len(shapes))]
    total = sum(n for n, _ in shapes)
    tables = _tables([c for _, c in shapes], bs, 64, seed=30)
    kc, vc = randn(64 * bs, nkv, d, seed=31), randn(64 * bs, nkv, d, seed=32)
    q = randn(total, nh, d, seed=33)
    pd = cpu.PagedDecode.for_spans(starts, [n for n, _ in shapes], tables, [c for _, c in shapes], bs, 64 * bs)
    out = torch.full_like(q, float("nan"))
    with_threads(threads, lambda: pd.run(q, kc, vc, out, d**-0.5))
    rows = [(starts[i] + j, tables[i], c - n + j + 1) for i, (n, c) in enumerate(shapes) for j in range(n)]
    one_by_one = _run([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], bs, q, kc, vc, d**-0.5)
    assert torch.equal(out, one_by_one)  # every row written (no NaN left), the decode kernel's bits
    f64 = _reference_f64(q, kc, vc, [r[0] for r in rows[::97]], [r[1] for r in rows[::97]],
                         [r[2] for r in rows[::97]], bs, d**-0.5)
    for tok, ref in f64.items():
        torch.testing.assert_close(out[tok].double(), ref, rtol=1e-5, atol=1e-5)


def test_for_spans_validates_spans() -> None:
    with pytest.raises(ValueError, match="num_query <= ctx_len"):
        cpu.PagedDecode.for_spans([0], [5], [[0, 1]], [4], 4, 16)
    with pytest.raises(ValueError, match="ctx_len 9 for 2 blocks"):
        cpu.PagedDecode.for_spans([0], [2], [[0, 1]], [9], 4, 16)
    with pytest.raises(ValueError, match="one entry per span"):
        cpu.PagedDecode.for_spans([0, 3], [2], [[0, 1]], [2], 4, 16)
    plan = cpu.PagedDecode.for_spans([2, 0], [3, 2], [[1], [3]], [4, 2], 4, 16)
    assert plan.tokens.tolist() == [2, 3, 4, 0, 1] and plan.ctx_lens.tolist() == [2, 3, 4, 1, 2]
    assert plan.block_table.tolist() == [[1]] * 3 + [[3]] * 2 and plan.max_token == 4


def test_for_spans_of_single_rows_equals_the_expansion() -> None:
    # A decode step (every span one row) skips the expansion: the same plan, field by field, as a
    # step whose first span has two rows and is then dropped from the expansion's result.
    plan = cpu.PagedDecode.for_spans([3, 0, 5], [1, 1, 1], [[1, 2], [3], [0, 2]], [6, 2, 5], 4, 16)
    assert plan.tiled and plan.num_seqs == 3 and plan.max_token == 5
    assert plan.tokens.tolist() == [3, 0, 5] and plan.ctx_lens.tolist() == [6, 2, 5]
    assert plan.block_table.tolist() == [[1, 2], [3, 0], [0, 2]]
    assert plan.tokens.dtype == plan.ctx_lens.dtype == plan.block_table.dtype == torch.int64
    full = cpu.PagedDecode.for_spans([6, 3, 0, 5], [2, 1, 1, 1], [[1, 2], [1, 2], [3], [0, 2]], [7, 6, 2, 5], 4, 16)
    assert full.tokens[2:].tolist() == plan.tokens.tolist() and full.ctx_lens[2:].tolist() == plan.ctx_lens.tolist()
    assert full.block_table[2:].tolist() == plan.block_table.tolist()


@settings(max_examples=40, deadline=None)
@given(data=st.data(), nkv=st.integers(1, 3), group=st.integers(1, 5), d=st.sampled_from([4, 12, 16, 64, 72, 136]),
       bs=st.sampled_from([1, 3, 4, 16]), threads=st.sampled_from([1, 2]))
def test_tiled_prefill_kernel_equals_decode_kernel_bitwise(data, nkv: int, group: int, d: int, bs: int,
                                                           threads: int) -> None:
    """``prefill_attention`` (tiles of a span's rows, K/V read once per tile) gives every row the
    decode kernel's bits: spans of any length, cached contexts, GQA groups, head sizes with
    and without a 64 / 8 tail, threads."""
    nh, blocks = nkv * group, 24
    lens = data.draw(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 12)), min_size=1, max_size=4))
    starts, queries, tables, ctxs, t, free = [], [], [], [], 0, list(range(blocks * 4 // bs + 40))
    for n, cached in lens:
        need = -(-(n + cached) // bs)
        tables.append([free.pop(data.draw(st.integers(0, len(free) - 1))) for _ in range(need)])
        starts.append(t)
        queries.append(n)
        ctxs.append(n + cached)
        t += n
    slots = (max(b for tb in tables for b in tb) + 1) * bs
    q, kc, vc = randn(t, nh, d, seed=1), randn(slots, nkv, d, seed=2), randn(slots, nkv, d, seed=3)
    plan = cpu.PagedDecode.for_spans(starts, queries, tables, ctxs, bs, slots)
    tiled, plain = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    with_threads(threads, lambda: plan.run(q, kc, vc, tiled, d**-0.5))
    plan.tiled = False  # the same plan on the decode kernel
    with_threads(threads, lambda: plan.run(q, kc, vc, plain, d**-0.5))
    assert torch.equal(tiled, plain)


@pytest.mark.parametrize(("nh", "nkv"), [(8, 4), (9, 3), (16, 2)])  # the AVX-512 head-pair path (d = 64)
def test_tiled_prefill_kernel_standard_shapes_equal_decode_kernel(nh: int, nkv: int) -> None:
    d, bs = 64, 16
    spans = [(0, 40, 40), (40, 17, 50), (57, 1, 33)]  # fresh prompt, continued prompt, decode row
    tables = [[3, 0, 5], [1, 6, 2, 9], [4, 7, 8]]
    slots = 10 * bs
    q, kc, vc = randn(58, nh, d, seed=4), randn(slots, nkv, d, seed=5), randn(slots, nkv, d, seed=6)
    plan = cpu.PagedDecode.for_spans([s[0] for s in spans], [s[1] for s in spans], tables, [s[2] for s in spans],
                                     bs, slots)
    tiled, plain = torch.empty_like(q), torch.empty_like(q)
    plan.run(q, kc, vc, tiled, d**-0.5)
    plan.tiled = False
    plan.run(q, kc, vc, plain, d**-0.5)
    assert torch.equal(tiled, plain)


@pytest.mark.parametrize("scale", [0.125, 40.0])  # 40: most numerators underflow (exp's clamp paths)
def test_tiled_kernel_rows_of_one_table_in_any_length_order_equal_decode_kernel(scale: float) -> None:
    """Rows that share a block table row form tiles of up to 8 rows; the head-pair path (d = 64)
    runs two rows at once over their common positions, then each row's own. Context lengths that
    fall and rise within a tile (each tile edge, 8- and 16-position softmax chunks and their
    tails) still give each row the decode kernel's bits. bf16 K/V always take the tiled kernel;
    the decode kernel runs on the widened (exact) caches."""
    nh, nkv, d, bs = 8, 4, 64, 16
    lens = [37, 36, 40, 8, 9, 1, 24, 33, 16, 15, 17, 48, 47, 2]
    table = [5, 1, 3]
    slots = 6 * bs
    q = randn(len(lens), nh, d, seed=7)
    kc = randn(slots, nkv, d, seed=8).to(torch.bfloat16)
    vc = randn(slots, nkv, d, seed=9).to(torch.bfloat16)
    plan = cpu.PagedDecode(list(range(len(lens))), [table] * len(lens), lens, bs, slots)
    tiled, plain = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    plan.run(q, kc, vc, tiled, scale)
    plan.run(q, kc.float(), vc.float(), plain, scale)  # fp32 caches, plan not tiled: the decode kernel
    assert torch.equal(tiled, plain)
    rows = torch.tensor([(table[p // bs] * bs + p % bs) for p in range(max(lens))])
    for b, n in enumerate(lens):  # and a float64 reference
        k, v = kc.double()[rows[:n]], vc.double()[rows[:n]]  # [n, nkv, d]
        s = torch.einsum("hd,nhd->hn", q[b].double(), k.repeat_interleave(nh // nkv, dim=1)) * scale
        ref = torch.einsum("hn,nhd->hd", s.softmax(-1), v.repeat_interleave(nh // nkv, dim=1))
        torch.testing.assert_close(tiled[b].double(), ref, rtol=1e-4, atol=1e-5)


# (nh, nkv): G = 2 (the standard MoE's 8 / 4: K/V rows of stride 256), 4 (R = 4 rows a group), 8 over
# one KV head (stride 64) and two (128), 16 (R = 1: decode rows of bf16 K/V take it too), G = 2 over 8
# KV heads (stride 512: no constant-stride case); G = 6 (even, not dividing 16) and 3 stay on the pairs
LANES_GEOMETRY = [(8, 4), (16, 4), (8, 1), (16, 2), (16, 1), (16, 8), (12, 2), (9, 3)]


@pytest.mark.parametrize(("nh", "nkv"), LANES_GEOMETRY)
@pytest.mark.parametrize("bs", [4, 16, 24, 48])  # a block shorter than 16 keys, one, 16 + 8, three chunks
@pytest.mark.parametrize("kv_bf16", [False, True])
def test_lanes_path_groups_equal_decode_kernel_bitwise(nh: int, nkv: int, bs: int, kv_bf16: bool) -> None:
    """Whole groups of 16 / G rows of one tile (d = 64, G even dividing 16) run as 16 lanes
    (csrc/prefill_attention.c lanes_rows): lengths that rise and fall inside a group (1 position,
    tails of 1-7 past a multiple of 8, exact multiples of 8 and 16, one past a block), rows
    scattered in q, a tile's partial group after whole ones, 1 and 3 threads. Every row gets the
    decode kernel's bits (on the widened caches for bf16 K/V) and every row is written."""
    d, scale = 64, 0.125
    lens = [37, 36, 40, 8, 9, 1, 24, 33, 16, 15, 17, 48, 47, 2, 64, 63, 31, 7, 49, 56]
    n_blocks = -(-max(lens) // bs)
    table = list(range(2 * n_blocks, n_blocks, -1))[:n_blocks] if n_blocks > 1 else [3]
    table = [b + 1 for b in table]
    slots = (max(table) + 2) * bs
    rows = torch.randperm(len(lens) + 5, generator=torch.Generator().manual_seed(nh + bs))[: len(lens)].tolist()
    q = randn(len(lens) + 5, nh, d, seed=nh * 7 + nkv)
    kc, vc = randn(slots, nkv, d, seed=11), randn(slots, nkv, d, seed=12)
    if kv_bf16:
        kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    plan = cpu.PagedDecode(rows, [table] * len(lens), lens, bs, slots)
    plan.tiled = True  # rows of one table row: tiles of 8 (the last one of 4)
    ref = torch.full_like(q, float("nan"))
    cpu.PagedDecode(rows, [table] * len(lens), lens, bs, slots).run(q, kc.float(), vc.float(), ref, scale)
    assert not ref[rows].isnan().any()
    for threads in (1, 3):
        out = torch.full_like(q, float("nan"))
        with_threads(threads, lambda out=out: plan.run(q, kc, vc, out, scale))
        assert torch.equal(out[rows], ref[rows])  # the decode kernel's bits (NaN-free: every row written)
        others = [r for r in range(q.shape[0]) if r not in set(rows)]
        assert bool(out[others].isnan().all())  # nothing else written
    if kv_bf16:  # decode rows (a tile of one row: neighbours on other tables), as bf16 K/V's decode steps run
        tables = [table, table[::-1], table]
        single = cpu.PagedDecode(rows[:3], tables, lens[:3], bs, slots)
        out, want = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
        single.run(q, kc, vc, out, scale)
        cpu.PagedDecode(rows[:3], tables, lens[:3], bs, slots).run(q, kc.float(), vc.float(), want, scale)
        assert torch.equal(out[rows[:3]], want[rows[:3]])


def test_lanes_path_underflowing_numerators_equal_decode_kernel_bitwise() -> None:
    """A scale at which most numerators underflow to 0 (exp16's clamp lanes) and one that
    overflows nothing: the lanes path's vertical softmax keeps the decode kernel's bits."""
    nh, nkv, d, bs = 8, 4, 64, 16
    lens = [23, 24, 25, 9, 16, 1, 40, 39]
    table = [2, 0, 1]
    q = randn(8, nh, d, seed=21) * 4.0
    kc, vc = randn(4 * bs, nkv, d, seed=22), randn(4 * bs, nkv, d, seed=23)
    for scale in (40.0, 1e-3):
        plan = cpu.PagedDecode(list(range(8)), [table] * 8, lens, bs, 4 * bs)
        plan.tiled = True
        out = torch.full_like(q, float("nan"))
        plan.run(q, kc, vc, out, scale)
        plan.tiled = False
        want = torch.full_like(q, float("nan"))
        plan.run(q, kc, vc, want, scale)
        assert torch.equal(out, want)
