"""Fused elementwise kernels (execstate.kernels.fused): ``rms_norm``, ``qkv_rope``, ``silu_mul``.

Oracles: float64 references written here; the model's own torch paths (``RMSNorm`` /
``GatedMLP`` / ``Attention`` with ``use_kernels=False``, ``RotaryEmbedding.apply`` on cos/sin
from a real ``RotaryEmbedding``); the wrappers' numerics contract: ``qkv_rope`` without
QK-norm is bitwise equal to the torch path (same fp32 multiplies and adds), ``rms_norm`` and
``silu_mul`` round within ~1e-6 relative, every kernel is per row (bitwise batch invariant)
and independent of the thread count.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu
from execstate.model.config import ModelConfig
from execstate.model.layers import Attention, GatedMLP, RMSNorm
from execstate.model.rotary import RotaryEmbedding

# Below T * H of this many floats the kernels stay on one thread (16 * PARALLEL_MIN_MACS in csrc/simd.h).
PARALLEL_MIN_ELEMS = 16 * 65536


# ---------------------------------------------------------------------------------- rms_norm


def _rms_module(weight: torch.Tensor, eps: float, use_kernels: bool = False) -> RMSNorm:
    m = RMSNorm(weight.shape[0], eps)
    m.weight.data.copy_(weight)
    m.use_kernels = use_kernels
    return m


def _rms_f64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return weight.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("h", [37, 5, 576, 1, 8, 15, 64])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm_matches_torch_module_and_float64(h: int, eps: float) -> None:
    x = randn(9, h, seed=h) * 3.0
    x[4] *= 1e-3  # a small-norm row: eps matters there
    w = randn(h, seed=h + 1)
    y = cpu.rms_norm(x, w, eps)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.is_contiguous()
    torch.testing.assert_close(y.double(), _rms_f64(x, w, eps), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(y, _rms_module(w, eps)(x), rtol=1e-5, atol=1e-6)


def test_rms_norm_module_routes_to_the_kernel_only_for_fp32_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = cpu.rms_norm
    monkeypatch.setattr(cpu, "rms_norm", lambda x, *a: calls.append(tuple(x.shape)) or real(x, *a))
    w = randn(37, seed=3)
    x = randn(6, 37, seed=4)
    on, off = _rms_module(w, 1e-6, use_kernels=True), _rms_module(w, 1e-6)
    with torch.no_grad():
        assert torch.equal(on(x), real(x, w, 1e-6))
        torch.testing.assert_close(on(x), off(x), rtol=1e-5, atol=1e-6)
        calls.clear()
        # 3-D (per-head QK-norm) and bf16 inputs stay on torch.
        x3 = x.view(2, 3, 37)
        assert torch.equal(on(x3), off(x3))
        xb = x.bfloat16()
        assert torch.equal(on(xb), off(xb))
        assert calls == []
        on(x)
        assert calls == [(6, 37)]


def test_rms_norm_zero_rows_and_zero_vector() -> None:
    w = randn(37, seed=5)
    y = cpu.rms_norm(torch.empty(0, 37), w, 1e-6)
    assert y.shape == (0, 37)
    # An all-zero row: 0 / sqrt(eps), no NaN.
    y = cpu.rms_norm(torch.zeros(2, 37), w, 1e-6)
    assert torch.equal(y, torch.zeros(2, 37))


def test_rms_norm_large_batch_parallel_path() -> None:
    t, h = 2048, 576
    assert t * h >= PARALLEL_MIN_ELEMS
    x, w = randn(t, h, seed=6), randn(h, seed=7)
    one = with_threads(1, lambda: cpu.rms_norm(x, w, 1e-6))
    two = with_threads(2, lambda: cpu.rms_norm(x, w, 1e-6))
    assert torch.equal(one, two)
    torch.testing.assert_close(two.double(), _rms_f64(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    # Every row is the row computed alone (rows handed to either thread).
    for i in (0, 1, 1023, 1024, 2047):
        assert torch.equal(two[i : i + 1], cpu.rms_norm(x[i : i + 1].clone(), w, 1e-6))


@pytest.mark.parametrize("h", [37, 576, 5])
def test_rms_norm_is_batch_invariant_bitwise(h: int) -> None:
    x, w = randn(16, h, seed=h + 8), randn(h, seed=h + 9)
    alone = torch.cat([cpu.rms_norm(x[i : i + 1].clone(), w, 1e-6) for i in range(16)])
    for rows in (torch.arange(16), torch.tensor([5, 3, 15, 0]), torch.tensor([9])):
        assert torch.equal(cpu.rms_norm(x[rows].contiguous(), w, 1e-6), alone[rows])
    # A contiguous view with a storage offset gives the same bits.
    view = x[3:9]
    assert view.storage_offset() > 0 and view.is_contiguous()
    assert torch.equal(cpu.rms_norm(view, w, 1e-6), alone[3:9])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("t", "h"), [(2048, 512), (2053, 37), (7, 576), (1, 5)])
def test_add_rms_norm_is_torch_add_then_rms_norm_bitwise(threads: int, t: int, h: int) -> None:
    x, a, w = randn(t, h, seed=t), randn(t, h, seed=h) * 3.0, randn(h, seed=t + h)
    want_s = x + a
    want = cpu.rms_norm(want_s, w, 1e-6)
    a_in = a.clone()
    s, out = with_threads(threads, lambda: cpu.add_rms_norm(x, a_in, w, 1e-6))
    assert s.data_ptr() == a_in.data_ptr()  # the sum is written over the branch output
    assert torch.equal(s, want_s)
    assert torch.equal(out, want)
    assert torch.equal(x, randn(t, h, seed=t))  # the residual input is left alone
    # per row: a row alone gives the same bits as the row in the batch
    for i in (0, t // 2, t - 1):
        s1, o1 = cpu.add_rms_norm(x[i : i + 1].clone(), a[i : i + 1].clone(), w, 1e-6)
        assert torch.equal(s1[0], want_s[i]) and torch.equal(o1[0], want[i])


def test_add_rms_norm_bad_shapes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="add_rms_norm"):
        cpu.add_rms_norm(randn(4, 8, seed=1), randn(4, 9, seed=2), randn(8, seed=3), 1e-6)
    with pytest.raises(ValueError, match="add_rms_norm"):
        cpu.add_rms_norm(randn(4, 8, seed=1), randn(4, 8, seed=2), randn(9, seed=3), 1e-6)


def test_rms_norm_bad_input_names_the_argument() -> None:
    x, w = randn(4, 37, seed=10), randn(37, seed=11)
    cases = [
        ((x.double(), w), "x must be a contiguous float32"),
        ((x.bfloat16(), w), "x must be a contiguous float32"),
        ((x, w.double()), "weight must be a contiguous float32"),
        ((randn(37, 4, seed=12).t(), w), r"x must be .*non-contiguous"),
        ((x, randn(74, seed=13)[::2]), r"weight must be .*non-contiguous"),
        ((x[None], w), "x must be a 2-D tensor"),
        ((x[0], w), "x must be a 2-D tensor"),
        ((x, w[None]), "weight must be a 1-D tensor"),
        ((x, w[:36].contiguous()), "weight has 36 entries for rows of 37"),
        ((x, randn(38, seed=14)), "weight has 38 entries for rows of 37"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.rms_norm(*args, 1e-6)
    assert cpu.use_rows(x) and not cpu.use_rows(x[None]) and not cpu.use_rows(x.double())
    assert not cpu.use_rows(x.t())


# ---------------------------------------------------------------------------------- qkv_rope


def _config(nh: int = 8, nkv: int = 2, d: int = 64, rope: dict | None = None,
            arch: str = "Qwen3ForCausalLM") -> ModelConfig:
    extra = {} if rope is None else {"rope_parameters": dict(rope)}
    return ModelConfig.from_dict(dict(
        architectures=[arch], hidden_size=48 if arch != "OlmoeForCausalLM" else nh * d,
        num_attention_heads=nh, num_key_value_heads=nkv, head_dim=d, num_hidden_layers=1, vocab_size=32,
        intermediate_size=32, num_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-6,
        max_position_embeddings=8192, **extra))


ROPES = [
    None,  # default, rope_theta 10000
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
]


def _cos_sin(config: ModelConfig, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, 1, d]`` of a real RotaryEmbedding at scattered positions."""
    pos = torch.randint(0, 8192, (t,), generator=torch.Generator().manual_seed(seed))
    cos, sin = RotaryEmbedding(config).cos_sin(pos, torch.float32)
    assert cos.shape == (t, 1, config.head_dim) and cos.is_contiguous()
    return cos, sin


def _torch_qkv_rope(qkv, cos, sin, q_norm, k_norm, eps, nh, nkv, d):
    """The model's torch path (Attention.forward, per-head QK-norm): split, reshape, norm, rotate."""
    t = qkv.shape[0]
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    q, k, v = q.reshape(t, nh, d), k.reshape(t, nkv, d), v.reshape(t, nkv, d).contiguous()
    if q_norm is not None:
        with torch.no_grad():
            q, k = _rms_module(q_norm, eps)(q), _rms_module(k_norm, eps)(k)
    return RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin), v


def _f64_qkv_rope(qkv, cos, sin, q_norm, k_norm, eps, nh, nkv, d):
    t = qkv.shape[0]
    x = qkv.double()
    q, k = x[:, : nh * d].reshape(t, nh, d), x[:, nh * d : (nh + nkv) * d].reshape(t, nkv, d)
    if q_norm is not None:
        q, k = _rms_f64(q, q_norm, eps), _rms_f64(k, k_norm, eps)
    c, s = cos.double(), sin.double()

    def rot(h):
        return h * c + torch.cat((-h[..., d // 2 :], h[..., : d // 2]), dim=-1) * s

    return rot(q), rot(k)


@pytest.mark.parametrize("rope", range(len(ROPES)))
@pytest.mark.parametrize(("nh", "nkv", "d"), [(8, 2, 64), (8, 2, 6), (4, 4, 6), (3, 1, 2), (2, 1, 128)])
def test_qkv_rope_without_norm_is_bitwise_the_torch_path(nh: int, nkv: int, d: int, rope: int) -> None:
    config = _config(nh, nkv, d, ROPES[rope])
    t = 7
    cos, sin = _cos_sin(config, t, seed=d + rope)
    qkv = randn(t, (nh + 2 * nkv) * d, seed=nh * d) * 4.0
    q, k, v = cpu.qkv_rope(qkv, cos.view(t, d), sin.view(t, d), None, None, 1e-6, nh, nkv, d)
    assert q.shape == (t, nh, d) and k.shape == v.shape == (t, nkv, d)
    assert all(x.is_contiguous() and x.dtype == torch.float32 for x in (q, k, v))
    tq, tk, tv = _torch_qkv_rope(qkv, cos, sin, None, None, 1e-6, nh, nkv, d)
    assert torch.equal(q, tq) and torch.equal(k, tk) and torch.equal(v, tv)
    # ... and the rotation is the right one (not merely the same as a shared wrong one).
    fq, fk = _f64_qkv_rope(qkv, cos, sin, None, None, 1e-6, nh, nkv, d)
    torch.testing.assert_close(q.double(), fq, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(k.double(), fk, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("rope", range(len(ROPES)))
@pytest.mark.parametrize(("nh", "nkv", "d"), [(8, 2, 64), (8, 2, 6), (4, 4, 6), (2, 1, 37 * 2)])
def test_qkv_rope_with_per_head_norm_matches_torch(nh: int, nkv: int, d: int, rope: int) -> None:
    config = _config(nh, nkv, d, ROPES[rope])
    t, eps = 6, 1e-6
    cos, sin = _cos_sin(config, t, seed=d + 10 + rope)
    qkv = randn(t, (nh + 2 * nkv) * d, seed=nh + d) * 3.0
    qkv[2, :d] *= 1e-4  # a tiny head: the norm's eps matters
    q_norm, k_norm = 1.0 + 0.5 * randn(d, seed=1), 1.0 + 0.5 * randn(d, seed=2)
    q, k, v = cpu.qkv_rope(qkv, cos.view(t, d), sin.view(t, d), q_norm, k_norm, eps, nh, nkv, d)
    tq, tk, tv = _torch_qkv_rope(qkv, cos, sin, q_norm, k_norm, eps, nh, nkv, d)
    torch.testing.assert_close(q, tq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, tk, rtol=1e-5, atol=1e-5)
    assert torch.equal(v, tv)  # v is copied, never normalised
    fq, fk = _f64_qkv_rope(qkv, cos, sin, q_norm, k_norm, eps, nh, nkv, d)
    torch.testing.assert_close(q.double(), fq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.double(), fk, rtol=1e-5, atol=1e-5)
    # q and k use their own weights (swapping them is visible).
    sq, _, _ = cpu.qkv_rope(qkv, cos.view(t, d), sin.view(t, d), k_norm, q_norm, eps, nh, nkv, d)
    assert not torch.allclose(sq, q, rtol=1e-3, atol=1e-3)


def test_qkv_rope_empty_batch() -> None:
    q, k, v = cpu.qkv_rope(torch.empty(0, 12 * 64), torch.empty(0, 64), torch.empty(0, 64), None, None, 1e-6,
                           8, 2, 64)
    assert q.shape == (0, 8, 64) and k.shape == v.shape == (0, 2, 64)


@pytest.mark.parametrize("norm", [False, True])
def test_qkv_rope_parallel_path_is_batch_and_thread_invariant(norm: bool) -> None:
    nh, nkv, d = 8, 2, 64
    t = 1400
    assert t * (nh + 2 * nkv) * d >= PARALLEL_MIN_ELEMS
    config = _config(nh, nkv, d)
    cos, sin = _cos_sin(config, t, seed=20)
    cos2, sin2 = cos.view(t, d), sin.view(t, d)
    qkv = randn(t, (nh + 2 * nkv) * d, seed=21)
    qn, kn = (randn(d, seed=22), randn(d, seed=23)) if norm else (None, None)
    one = with_threads(1, lambda: cpu.qkv_rope(qkv, cos2, sin2, qn, kn, 1e-6, nh, nkv, d))
    two = with_threads(2, lambda: cpu.qkv_rope(qkv, cos2, sin2, qn, kn, 1e-6, nh, nkv, d))
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)
    ref = _torch_qkv_rope(qkv, cos, sin, qn, kn, 1e-6, nh, nkv, d)
    for a, b in zip(two, ref, strict=True):
        if norm:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)
    for i in (0, 699, 700, 1399):  # a row alone gives the bits it had in the batch
        alone = cpu.qkv_rope(qkv[i : i + 1].clone(), cos2[i : i + 1].clone(), sin2[i : i + 1].clone(), qn, kn,
                             1e-6, nh, nkv, d)
        for a, b in zip(alone, two, strict=True):
            assert torch.equal(a, b[i : i + 1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("t", "nh", "nkv", "d", "norm"), [(1400, 8, 2, 64, False), (1400, 8, 4, 64, True),
                                                          (7, 3, 1, 6, True), (1, 2, 1, 128, False)])
def test_qkv_rope_to_cache_stores_qkv_ropes_k_and_v_at_the_slots_bitwise(t: int, nh: int, nkv: int, d: int,
                                                                       norm: bool, threads: int) -> None:
    config = _config(nh, nkv, d)
    cos, sin = _cos_sin(config, t, seed=40 + d)
    cos2, sin2 = cos.view(t, d), sin.view(t, d)
    qkv = randn(t, (nh + 2 * nkv) * d, seed=41 + t)
    qn, kn = (randn(d, seed=42), randn(d, seed=43)) if norm else (None, None)
    n_slots = 2 * t + 5
    slots = torch.randperm(n_slots, generator=torch.Generator().manual_seed(44))[:t].contiguous()  # scattered, unique
    kc = torch.full((n_slots, nkv, d), float("nan"))
    vc = torch.full((n_slots, nkv, d), float("nan"))
    q = with_threads(threads, lambda: cpu.qkv_rope_to_cache(qkv, cos2, sin2, qn, kn, 1e-6, nh, d, kc, vc, slots))
    rq, rk, rv = cpu.qkv_rope(qkv, cos2, sin2, qn, kn, 1e-6, nh, nkv, d)
    assert q.shape == (t, nh, d) and torch.equal(q, rq)
    assert torch.equal(kc[slots], rk) and torch.equal(vc[slots], rv)
    untouched = torch.ones(n_slots, dtype=torch.bool)
    untouched[slots] = False
    assert kc[untouched].isnan().all() and vc[untouched].isnan().all()  # nothing written beside the slots
    fq, fk = _f64_qkv_rope(qkv, cos, sin, qn, kn, 1e-6, nh, nkv, d)  # and the values are the right ones
    torch.testing.assert_close(kc[slots].double(), fk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc[slots], qkv[:, (nh + nkv) * d :].reshape(t, nkv, d), rtol=0, atol=0)


def test_qkv_rope_to_cache_bad_slots_write_nothing() -> None:
    nh, nkv, d, t = 4, 2, 8, 3
    qkv = randn(t, (nh + 2 * nkv) * d, seed=50)
    cos, sin = randn(t, d, seed=51), randn(t, d, seed=52)
    kc, vc = torch.zeros(6, nkv, d), torch.zeros(6, nkv, d)
    for bad in ([0, 6, 1], [-1, 0, 1]):
        with pytest.raises(ValueError, match="slot .* outside \\[0, 6\\)"):
            cpu.qkv_rope_to_cache(qkv, cos, sin, None, None, 1e-6, nh, d, kc, vc, torch.tensor(bad))
        assert not kc.any() and not vc.any()
    with pytest.raises(ValueError, match="2 slots for 3 tokens"):
        cpu.qkv_rope_to_cache(qkv, cos, sin, None, None, 1e-6, nh, d, kc, vc, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="slots must be a contiguous int64"):
        cpu.qkv_rope_to_cache(qkv, cos, sin, None, None, 1e-6, nh, d, kc, vc,
                              torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="k_cache .* for heads of 8"):
        cpu.qkv_rope_to_cache(qkv, cos, sin, None, None, 1e-6, nh, d, kc, torch.zeros(6, nkv, d + 1),
                              torch.tensor([0, 1, 2]))


def test_qkv_rope_bad_input() -> None:
    nh, nkv, d, t = 8, 2, 64, 3
    qkv = randn(t, (nh + 2 * nkv) * d, seed=30)
    cos, sin = randn(t, d, seed=31), randn(t, d, seed=32)
    qn, kn = randn(d, seed=33), randn(d, seed=34)
    good = dict(qkv=qkv, cos=cos, sin=sin, q_norm=qn, k_norm=kn, eps=1e-6, num_heads=nh, num_kv_heads=nkv,
                head_dim=d)
    cases = [
        # odd head_dim (widths consistent with it)
        (dict(qkv=randn(t, 12 * 5, seed=35), cos=cos[:, :5].contiguous(), sin=sin[:, :5].contiguous(),
              q_norm=None, k_norm=None, head_dim=5), "qkv rows of 60 for 8\\+2x2 heads of 5"),
        (dict(qkv=qkv[:, :-1].contiguous()), "qkv rows of 767"),
        (dict(num_kv_heads=1), "qkv rows of 768 for 8\\+2x1 heads of 64"),
        (dict(cos=cos[:, :32].contiguous()), "cos/sin must be \\[3, 64\\]"),
        (dict(sin=randn(t + 1, d, seed=36)), "cos/sin must be \\[3, 64\\]"),
        (dict(cos=cos[None]), "cos must be a 2-D tensor"),
        (dict(cos=cos.double()), "cos must be a contiguous float32"),
        (dict(sin=randn(d, t, seed=37).t()), r"sin must be .*non-contiguous"),
        (dict(qkv=qkv.bfloat16()), "qkv must be a contiguous float32"),
        (dict(qkv=qkv.view(t, 12, d)), "qkv must be a 2-D tensor"),
        (dict(q_norm=None), "give both q_norm and k_norm or neither"),
        (dict(k_norm=None), "give both q_norm and k_norm or neither"),
        (dict(q_norm=qn[:32].contiguous()), "per-head norm weights must have 64 entries"),
        (dict(k_norm=randn(65, seed=38)), "per-head norm weights must have 64 entries"),
        (dict(k_norm=kn.double()), "k_norm must be a contiguous float32"),
        (dict(q_norm=qn[None]), "q_norm must be a 1-D tensor"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.qkv_rope(**{**good, **change})


class _Capture:
    """An attention backend that records q/k/v and returns zeros."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.seen.append((q.clone(), k.clone(), v.clone()))
        return torch.zeros_like(q)


def _attention(config: ModelConfig, seed: int) -> Attention:
    attn = Attention(config, 0).requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    for p in attn.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return attn


def _attention_qkv(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, use_kernels: bool):
    attn.use_kernels = use_kernels
    capture = _Capture()
    with torch.no_grad():
        attn(x, cos, sin, SimpleNamespace(attention=capture))
    attn.use_kernels = False
    (qkv,) = capture.seen
    return qkv


@pytest.mark.parametrize(("arch", "fused"), [("LlamaForCausalLM", True), ("Qwen3ForCausalLM", True),
                                             ("OlmoeForCausalLM", False)])
def test_attention_layer_fused_prep_vs_torch(arch: str, fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention.forward with use_kernels: Llama (no QK-norm) bitwise, Qwen3 (per-head QK-norm)
    to rounding; OLMoE (whole-projection QK-norm) keeps the torch path."""
    calls: list[int] = []
    real = cpu.qkv_rope
    monkeypatch.setattr(cpu, "qkv_rope", lambda qkv, *a: calls.append(qkv.shape[0]) or real(qkv, *a))
    config = _config(8, 2 if arch != "OlmoeForCausalLM" else 8, 16, ROPES[1], arch=arch)
    attn = _attention(config, seed=40)
    assert (attn.q_norm is not None) == (arch != "LlamaForCausalLM")
    t = 5
    x = randn(t, config.hidden_size, seed=41)
    cos, sin = _cos_sin(config, t, seed=42)
    ref = _attention_qkv(attn, x, cos, sin, use_kernels=False)
    assert calls == []
    got = _attention_qkv(attn, x, cos, sin, use_kernels=True)
    assert calls == ([t] if fused else [])
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape and a.is_contiguous()
        if arch == "Qwen3ForCausalLM":
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


# ---------------------------------------------------------------------------------- silu_mul


def _silu_f64(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, dim=-1)
    return g * torch.sigmoid(g) * u


@pytest.mark.parametrize("inter", [1, 3, 7, 8, 9, 16, 37, 100])
def test_silu_mul_matches_torch_and_float64(inter: int) -> None:
    gate_up = randn(6, 2 * inter, seed=inter) * 4.0
    h = cpu.silu_mul(gate_up)
    assert h.shape == (6, inter) and h.dtype == torch.float32 and h.is_contiguous()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(h, F.silu(gate) * up, rtol=1e-6, atol=1e-30)
    torch.testing.assert_close(h.double(), _silu_f64(gate_up), rtol=1e-6, atol=1e-30)


def test_silu_mul_large_magnitudes_saturate_without_nan_or_inf() -> None:
    """The kernel's exp overflows to +inf above 88.72 and flushes to 0 below -87.33 (as expf
    would, near enough): at |gate| of 87..1e38 the result must be finite and match torch
    (silu(g) = g for large g, -0 for very negative g)."""
    edges = [90.0, -90.0, 88.0, -88.0, 87.5, -87.5, 86.0, -86.0, 100.0, -100.0, 1e4, -1e4, 20.0, -20.0, 0.0,
             -0.0, 1e-30, -1e-30, 1e30, -1e30, 1e38, -1e38]
    # Each edge value in a vector lane (first 8 columns) and in the scalar tail (column 8).
    gate = torch.tensor(edges).repeat_interleave(9).reshape(len(edges), 9)
    up = randn(len(edges), 1, seed=50).expand(-1, 9)  # one up value per row
    gate_up = torch.cat([gate, up], dim=1).contiguous()
    h = cpu.silu_mul(gate_up)
    ref = F.silu(gate) * up
    assert torch.isfinite(ref).all()
    assert torch.isfinite(h).all()
    torch.testing.assert_close(h, ref, rtol=1e-6, atol=1e-30)
    # The vector lanes and the scalar tail compute the same function, bit for bit.
    assert torch.equal(h[:, :8], h[:, 8:9].expand(-1, 8))


def test_silu_mul_nan_propagates_like_torch() -> None:
    gate_up = torch.tensor([[float("nan"), 1.0, 2.0, 3.0]])
    h = cpu.silu_mul(gate_up)
    assert torch.isnan(h[0, 0]) and h[0, 1].item() == pytest.approx(F.silu(torch.tensor(1.0)).item() * 3.0)
    # infinite gates, in vector lanes (8 columns) and the scalar tail: same as torch (+inf, NaN)
    gate = torch.tensor([float("inf"), float("-inf")]).repeat_interleave(9).reshape(2, 9)
    h = cpu.silu_mul(torch.cat([gate, torch.ones_like(gate)], dim=1))
    ref = F.silu(gate)
    assert torch.equal(torch.isnan(h), torch.isnan(ref)) and torch.equal(h[0], ref[0])


@pytest.mark.parametrize("inter", [37, 8])
def test_silu_mul_is_batch_invariant_bitwise(inter: int) -> None:
    gate_up = randn(10, 2 * inter, seed=60 + inter) * 3.0
    alone = torch.cat([cpu.silu_mul(gate_up[i : i + 1].clone()) for i in range(10)])
    assert torch.equal(cpu.silu_mul(gate_up), alone)
    rows = torch.tensor([7, 2, 9])
    assert torch.equal(cpu.silu_mul(gate_up[rows].contiguous()), alone[rows])


def test_silu_mul_edges_and_bad_input() -> None:
    assert cpu.silu_mul(torch.empty(0, 10)).shape == (0, 5)
    assert cpu.silu_mul(torch.empty(3, 0)).shape == (3, 0)
    gate_up = randn(4, 10, seed=70)
    cases = [
        (randn(4, 9, seed=71), "silu_mul: gate_up has an odd width 9"),
        (randn(4, 1, seed=72), "silu_mul: gate_up has an odd width 1"),
        (gate_up.double(), "gate_up must be a contiguous float32"),
        (gate_up.bfloat16(), "gate_up must be a contiguous float32"),
        (randn(10, 4, seed=73).t(), r"gate_up must be .*non-contiguous"),
        (gate_up[None], "gate_up must be a 2-D tensor"),
        (gate_up[0], "gate_up must be a 2-D tensor"),
    ]
    for arg, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.silu_mul(arg)


def test_gated_mlp_kernel_vs_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = cpu.silu_mul
    monkeypatch.setattr(cpu, "silu_mul", lambda gu: calls.append(gu.shape[0]) or real(gu))
    mlp = GatedMLP(24, 37).requires_grad_(False)
    g = torch.Generator().manual_seed(80)
    for p in mlp.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    x = randn(5, 24, seed=81)
    with torch.no_grad():
        ref = mlp(x)
        assert calls == []
        mlp.use_kernels = True
        got = mlp(x)
        assert calls == [5]
        mlp.use_kernels = False
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------- sigmoid


@pytest.mark.parametrize("n", [1, 7, 8, 9, 33, 1000])
def test_sigmoid_matches_float64_and_each_element_alone(n: int) -> None:
    x = randn(n, seed=n) * 6.0
    x[0] = -100.0  # exp overflow side: 1 / (1 + inf) = 0
    y = cpu.sigmoid(x)
    torch.testing.assert_close(y.double(), torch.sigmoid(x.double()), rtol=2e-6, atol=1e-7)
    # the same bits whatever the element's position (vector body or scalar tail) and length
    alone = torch.cat([cpu.sigmoid(x[i : i + 1].contiguous()) for i in range(n)])
    assert torch.equal(y, alone)
    assert torch.equal(cpu.sigmoid(x.view(n, 1)).view(n), y)


def test_sigmoid_bad_input() -> None:
    with pytest.raises(ValueError, match="float32"):
        cpu.sigmoid(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        cpu.sigmoid(torch.zeros(4, 4).t())
    assert cpu.sigmoid(torch.zeros(0)).shape == (0,)


def test_silu_mul_same_bits_in_16_lane_8_lane_and_scalar_positions() -> None:
    """With AVX-512 an element may be computed on 16 lanes (the first n & ~15), on 8 or alone
    (the tail); each element's result must not depend on which: 25 columns put a value in each
    kind of position, compared with the same value computed alone (inter = 1, the tail)."""
    edges = [90.0, -90.0, 88.0, -88.0, 87.5, -87.5, 20.0, -20.0, 0.0, -0.0, 1e-30, 1e30, -1e30, 88.72, -87.33]
    vals = torch.cat([torch.tensor(edges), randn(210, seed=70) * 6.0])  # 225 = 9 rows of 25
    up = randn(vals.numel(), seed=71)
    alone = cpu.silu_mul(torch.stack([vals, up], dim=1).contiguous())[:, 0]  # each value alone: the scalar tail
    gate = vals[:, None].expand(-1, 25)
    row = cpu.silu_mul(torch.cat([gate, up[:, None].expand(-1, 25)], dim=1).contiguous())
    assert torch.equal(row, alone[:, None].expand(-1, 25))
    wide = torch.cat([vals.reshape(-1, 25), up.reshape(-1, 25)], dim=1).contiguous()  # distinct values per row
    assert torch.equal(cpu.silu_mul(wide).flatten(), alone)
