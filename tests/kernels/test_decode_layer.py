"""The whole-layer decode path (``kernels/decode_layer.py``, ``model/decode_path.py``).

Oracles: the per-op kernel path (the same model with ``decode_layers`` switched off), which
the C entry must equal bit for bit (same kernels, same order); a row decoded alone against
the same row in any batch (batch invariance, what makes replay logprobs exact); and
``ValueError`` naming the problem for every bad table, size or weight before C runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import with_threads

import execstate.model.transformer as transformer
from execstate import LLM, SamplingParams
from execstate.kernels import decode_layer as kern
from execstate.kernels.weight_format import WeightFormat
from execstate.model.context import RouteCapture, StepContext
from execstate.model.gguf_model import load_gguf_model
from execstate.model.gguf_quantize import quantize_checkpoint
from execstate.model.loader import load_model
from execstate.model.paged_attention import PagedAttention, SeqSpan
from execstate.model.random_models import make_random
from execstate.model.weight_formats import use_bf16_arithmetic
from execstate.state.kv_pool import KVPool

BS = 4  # block size of the model-level tests (several blocks per sequence)
PATH_ARCHES = ("qwen3_moe", "qwen2_moe", "mixtral", "llama", "qwen3")  # every layer takes the path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, object]:
    dirs = {a: make_random(a, tmp_path_factory.mktemp(a), seed=3) for a in (*PATH_ARCHES, "olmoe")}
    # Wide enough that a layer forks (decode_layer.c: T * H * widths >= PARALLEL_MIN_MACS).
    wide = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, head_dim=64)
    dirs["qwen3_moe_wide"] = make_random("qwen3_moe", tmp_path_factory.mktemp("wide"), seed=4, **wide)
    # Dense MLP, q/k/v and o biases, tied embeddings (llama's tiny config), forking.
    dirs["llama_wide"] = make_random("llama", tmp_path_factory.mktemp("llama_wide"), seed=4, hidden_size=256,
                                     intermediate_size=512)
    for name, fmt in (("qwen3_moe", WeightFormat.Q4_1), ("llama", WeightFormat.Q8_0), ("qwen2_moe", WeightFormat.Q4_0),
                      ("qwen3_moe_wide", WeightFormat.Q4_1)):  # GGUF builds (mode "gguf")
        dirs[f"{name}_gguf"] = out = tmp_path_factory.mktemp(f"{name}_gguf")
        quantize_checkpoint(dirs[name], out, fmt, WeightFormat.Q8_0)
    return dirs


def _dir(model_dirs, arch: str, mode: str):
    """The checkpoint of ``arch`` a ``mode`` engine loads (mode "gguf": its GGUF build)."""
    return model_dirs[f"{arch}_gguf" if mode == "gguf" else arch]


def _count_layers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = kern.run_layer

    def counted(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(kern, "run_layer", counted)
    return calls


# numerics modes of the engine tests: engine kwargs
MODES = {"fp32": {}, "bf16w": {"dtype": "bfloat16"}, "bf16": {"dtype": "bfloat16", "compute_dtype": "bfloat16"},
         "gguf": {"quantization": "gguf"}}


def _generate(path, prompts, off: bool, monkeypatch: pytest.MonkeyPatch, mode: str = "fp32", **sp):
    llm = LLM(str(path), kernels="execstate", enable_return_routed_experts=True, enable_prefix_caching=False,
              block_size=BS, seed=0, **MODES[mode])
    with monkeypatch.context() as m:
        if off:
            m.setattr(transformer, "decode_layers", lambda *a, **k: None)
        return llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(max_tokens=10, ignore_eos=True, logprobs=2, **sp), use_tqdm=False)


@pytest.mark.parametrize(("arch", "mode"), [*((a, "fp32") for a in PATH_ARCHES), ("qwen3_moe", "bf16w"),
                                            ("llama", "bf16w"), ("qwen3_moe", "bf16"), ("llama", "bf16"),
                                            ("qwen2_moe", "bf16"), ("qwen3_moe", "gguf"), ("llama", "gguf"),
                                            ("qwen2_moe", "gguf")])
def test_engine_equals_per_op_path(arch, mode, model_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens, sampled-token logprobs, top logprobs and routes are bitwise those of the per-op
    path, greedy and seeded sampling, 3 sequences of different lengths in one batch; fp32 and
    bf16 weights, bf16 arithmetic."""
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 500, n).tolist() for n in (5, 13, 9)]
    calls = _count_layers(monkeypatch)
    for sp in (dict(temperature=0.0), dict(temperature=1.0, seed=5)):
        fast = _generate(_dir(model_dirs, arch, mode), prompts, False, monkeypatch, mode, **sp)
        slow = _generate(_dir(model_dirs, arch, mode), prompts, True, monkeypatch, mode, **sp)
        for a, b in zip(fast, slow, strict=True):
            oa, ob = a.outputs[0], b.outputs[0]
            assert oa.token_ids == ob.token_ids
            assert oa.logprobs == ob.logprobs
            if oa.routed_experts is not None:
                assert np.array_equal(oa.routed_experts, ob.routed_experts)
    n_layers = load_model(model_dirs[arch]).config.num_layers
    assert calls[0] >= 2 * 9 * n_layers  # 9 decode steps per run, every layer through the path


def test_olmoe_whole_row_qk_norm_falls_back(model_dirs) -> None:
    model = load_model(model_dirs["olmoe"])
    model.use_cpu_kernels(True)
    reason = model.decode_weights().reason
    assert reason is not None and reason.startswith("layer 0: clip_qkv")


def _prefilled(path, lens: list[int], seed: int, mode: str = "fp32"):
    """A kernel model in ``mode`` (``MODES``) and a pool holding each sequence's prompt
    (prefilled one at a time)."""
    model = load_gguf_model(path, path / "model.gguf") if mode == "gguf" else load_model(path)
    if mode in ("bf16w", "bf16"):
        model.store_weights_bf16()
    if mode == "bf16":
        use_bf16_arithmetic(model)
    model.use_cpu_kernels(True)
    cfg = model.config
    pool = KVPool(cfg.num_layers, 64, BS, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, at = [], 0
    gen = torch.Generator().manual_seed(seed)
    tokens = []
    for n in lens:
        k = -(-(n + 1) // BS)
        tables.append(perm[at : at + k])
        at += k
        ids = torch.randint(3, cfg.vocab_size, (n + 1,), generator=gen)
        tokens.append(ids)
        att = PagedAttention(pool, [SeqSpan(0, n, n, tables[-1])], use_kernels=True)
        with torch.inference_mode(), StepContext(torch.arange(n), att, _capture(cfg, n)) as ctx:
            model(ids[:n], ctx)
    return model, pool, tables, tokens


def _capture(cfg, n: int) -> RouteCapture | None:
    return RouteCapture(n, cfg.num_moe_layers, cfg.top_k) if cfg.is_moe else None


def _decode(model, pool, tables, tokens, lens, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hidden states and routes of one decode step of sequences ``rows``."""
    spans = [SeqSpan(i, 1, lens[r] + 1, tables[r]) for i, r in enumerate(rows)]
    att = PagedAttention(pool, spans, use_kernels=True)
    routes = _capture(model.config, len(rows))
    ids = torch.stack([tokens[r][lens[r]] for r in rows])
    with torch.inference_mode(), StepContext(torch.tensor([lens[r] for r in rows]), att, routes) as ctx:
        hidden = model(ids, ctx)
    return hidden, None if routes is None else routes.ids


@settings(max_examples=6, deadline=None)
@given(lens=st.lists(st.integers(1, 30), min_size=2, max_size=5), seed=st.integers(0, 1000),
       arch=st.sampled_from(["qwen3_moe", "llama"]), mode=st.sampled_from(sorted(MODES)))
def test_batch_invariance(model_dirs, lens, seed, arch, mode) -> None:
    """A sequence decoded alone equals the same sequence in a batch (any order), bit for bit,
    hidden state and routes, and both equal the per-op path; every numerics mode."""
    model, pool, tables, tokens = _prefilled(_dir(model_dirs, arch, mode), lens, seed, mode)
    assert model.decode_weights().reason is None
    order = list(range(len(lens)))[::-1] if seed % 2 else list(range(len(lens)))
    batch_h, batch_r = _decode(model, pool, tables, tokens, lens, order)
    for i, r in enumerate(order):
        alone_h, alone_r = _decode(model, pool, tables, tokens, lens, [r])
        assert torch.equal(alone_h[0], batch_h[i])
        if batch_r is not None:
            assert torch.equal(alone_r[0], batch_r[i])
    real = transformer.decode_layers
    transformer.decode_layers = lambda *a, **k: None
    try:
        slow_h, slow_r = _decode(model, pool, tables, tokens, lens, order)
    finally:
        transformer.decode_layers = real
    assert torch.equal(slow_h, batch_h)
    if batch_r is not None:
        assert torch.equal(slow_r, batch_r)


@pytest.mark.parametrize(("arch", "mode"), [("qwen3_moe_wide", "fp32"), ("llama_wide", "fp32"),
                                            ("qwen3_moe_wide", "bf16w"), ("qwen3_moe_wide", "bf16"),
                                            ("llama_wide", "bf16"), ("qwen3_moe_wide", "gguf")])
@pytest.mark.parametrize("lens", [[7], [3, 17, 9, 30, 1]])
def test_one_fork_per_layer_is_thread_count_invariant(model_dirs, lens, arch, mode) -> None:
    """On a model wide enough to fork, a step on 2 threads equals the step on 1 thread and the
    per-op path on 2 threads, bit for bit (each phase's split over the team changes nothing)."""
    model, pool, tables, tokens = _prefilled(_dir(model_dirs, arch, mode), lens, seed=2, mode=mode)
    rows = list(range(len(lens)))
    two = with_threads(2, lambda: _decode(model, pool, tables, tokens, lens, rows))
    one = with_threads(1, lambda: _decode(model, pool, tables, tokens, lens, rows))
    real = transformer.decode_layers
    transformer.decode_layers = lambda *a, **k: None
    try:
        slow = with_threads(2, lambda: _decode(model, pool, tables, tokens, lens, rows))
    finally:
        transformer.decode_layers = real
    for got in (one, slow):
        assert torch.equal(got[0], two[0])
        assert (got[1] is None and two[1] is None) or torch.equal(got[1], two[1])


def _tables_args(t: int = 2, num_blocks: int = 8):
    slots = torch.arange(t, dtype=torch.int64)
    tok = torch.arange(t, dtype=torch.int64)
    bt = torch.zeros((t, 2), dtype=torch.int64)
    cl = torch.ones(t, dtype=torch.int64)
    k = torch.zeros((2, num_blocks * BS, 2, 8))
    return [slots, tok, bt, cl, BS, k, torch.zeros_like(k)]


@pytest.mark.parametrize("index,value,match", [
    (0, torch.tensor([0, 32]), "slot lies outside"),
    (0, torch.tensor([0, -1]), "slot lies outside"),
    (1, torch.tensor([1, 0]), "decode-only step"),
    (2, torch.tensor([[0, 8], [0, 0]]), "block id lies outside"),
    (3, torch.tensor([1, 9]), "ctx_lens must be in"),
    (3, torch.tensor([0, 1]), "ctx_lens must be in"),
    (0, torch.tensor([0, 1], dtype=torch.int32), "slots must be contiguous int64"),
    (5, torch.zeros((2, 32, 2, 8), dtype=torch.float64), "k_cache must be a contiguous float32"),
])
def test_tables_reject_bad_input(index, value, match) -> None:
    args = _tables_args()
    args[index] = value
    with pytest.raises(ValueError, match=match):
        kern.DecodeTables(*args)


def test_tables_reject_too_many_tokens() -> None:
    with pytest.raises(ValueError, match="the decode layer takes 1..32"):
        kern.DecodeTables(*_tables_args(t=33, num_blocks=64))


def test_layer_weights_reject_bad_shapes() -> None:
    h, nh, nkv, d = 16, 2, 1, 8
    ok = dict(in_norm=torch.ones(h), w_qkv=torch.zeros((nh + 2 * nkv) * d, h), b_qkv=None, q_norm=None, k_norm=None,
              w_o=torch.zeros(h, nh * d), b_o=None, post_norm=torch.ones(h))
    kw = dict(num_heads=nh, num_kv_heads=nkv, head_dim=d, eps=1e-6)
    kern.layer_weights(**ok, **kw)
    with pytest.raises(ValueError, match=r"w_o must be \(16, 16\)"):
        kern.layer_weights(**{**ok, "w_o": torch.zeros(h, h + 1)}, **kw)
    with pytest.raises(ValueError, match="w_qkv must be a contiguous float32"):
        kern.layer_weights(**{**ok, "w_qkv": torch.zeros(h, (nh + 2 * nkv) * d).t()}, **kw)
    with pytest.raises(ValueError, match="w_o must be a contiguous bfloat16"):  # matrices: all bf16 or all fp32
        kern.layer_weights(**{**ok, "w_qkv": ok["w_qkv"].bfloat16()}, **kw)
    assert kern.layer_weights(**{**ok, "w_qkv": ok["w_qkv"].bfloat16(), "w_o": ok["w_o"].bfloat16()}, **kw).bf16
    with pytest.raises(ValueError, match="in_norm must be a contiguous float32"):
        kern.layer_weights(**{**ok, "in_norm": ok["in_norm"].bfloat16()}, **kw)
    with pytest.raises(ValueError, match="both q_norm and k_norm"):
        kern.layer_weights(**{**ok, "q_norm": torch.ones(d)}, **kw)
    with pytest.raises(ValueError, match="router or a dense MLP"):
        kern.layer_weights(**ok, **kw, w_router=torch.zeros(4, h), w_gate_up=torch.zeros(8, h),
                           w_down=torch.zeros(h, 4))
