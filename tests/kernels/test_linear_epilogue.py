"""The linears with an epilogue: ``cpu.linear_qkv_rope_to_cache`` (the q/k/v projection with the
bias add, QK-norm, RoPE and the K/V store) and ``cpu.linear_add_rms_norm`` (the o-proj with the
bias add, the residual add and the next RMSNorm).

Oracle: the unfused path it replaces, the linear (``cpu.linear`` for fp32 weights,
``linear_bf16dot`` for the bf16-arithmetic format), ``y + bias`` and ``cpu.qkv_rope_to_cache``:
q and every K/V row of the cache equal bit for bit, nothing written beside the slots, for row
counts around the kernel's blocks and the threads' shares, K with and without the GEMMs' tails,
head sizes on the 16-lane epilogue (d % 32 == 0) and off it, QK-norm and bias on and off, 1-3
threads; for ``linear_add_rms_norm`` the linear, ``y + bias`` and ``cpu.add_rms_norm``.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu, gemm_bf16dot
from execstate.kernels.gemm_bf16dot import linear_bf16dot

pytestmark = pytest.mark.skipif(not cpu.PACKED, reason="the fused projection needs AVX-512")

BF16DOT = [False] + ([True] if gemm_bf16dot.NATIVE else [])


def _inputs(t: int, k: int, nh: int, nkv: int, d: int, norm: bool, bias: bool, bf16dot: bool, seed: int):
    n = (nh + 2 * nkv) * d
    x = randn(t, k, seed=seed)
    w = randn(n, k, seed=seed + 1) * k**-0.5
    w = w.bfloat16() if bf16dot else w
    b = randn(n, seed=seed + 2) if bias else None
    cos, sin = randn(t, d, seed=seed + 3), randn(t, d, seed=seed + 4)
    qn, kn = (randn(d, seed=seed + 5), randn(d, seed=seed + 6)) if norm else (None, None)
    n_slots = 2 * t + 5
    slots = torch.randperm(n_slots, generator=torch.Generator().manual_seed(seed + 7))[:t].contiguous()
    return x, w, b, cos, sin, qn, kn, slots, n_slots


def _unfused(x, w, b, bf16dot, cos, sin, qn, kn, nh, d, kc, vc, slots):
    y = linear_bf16dot(x, w) if bf16dot else cpu.linear(x, w)
    if b is not None:
        y = y.add_(b)
    return cpu.qkv_rope_to_cache(y, cos, sin, qn, kn, 1e-6, nh, d, kc, vc, slots)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bf16dot", BF16DOT)
@pytest.mark.parametrize(("t", "k", "nh", "nkv", "d", "norm", "bias"), [
    (300, 64, 8, 4, 64, True, False),   # three blocks on one thread, two shares of 150
    (257, 77, 4, 2, 32, True, True),    # odd rows, a K % 8 (and % 32) tail, bias
    (129, 96, 8, 2, 16, False, True),   # d off the 16-lane epilogue
    (12, 40, 3, 1, 6, True, False),     # the fewest rows it takes, d = 6
    (64, 128, 2, 1, 128, False, False),
])
def test_fused_projection_equals_the_projection_then_qkv_rope_to_cache_bitwise(t: int, k: int, nh: int, nkv: int,
                                                                              d: int, norm: bool, bias: bool,
                                                                              bf16dot: bool, threads: int) -> None:
    x, w, b, cos, sin, qn, kn, slots, n_slots = _inputs(t, k, nh, nkv, d, norm, bias, bf16dot, seed=t + k + d)
    assert cpu.use_linear_epilogue(t, w, b, bf16dot)
    caches = [tuple(torch.full((n_slots, nkv, d), float("nan")) for _ in range(2)) for _ in range(2)]
    q = with_threads(threads, lambda: cpu.linear_qkv_rope_to_cache(x, w, b, bf16dot, cos, sin, qn, kn, 1e-6, nh, d,
                                                                   *caches[0], slots))
    rq = with_threads(threads, lambda: _unfused(x, w, b, bf16dot, cos, sin, qn, kn, nh, d, *caches[1], slots))
    assert q.shape == (t, nh, d) and torch.isfinite(q).all()
    assert torch.equal(q, rq)
    (kc, vc), (rk, rv) = caches
    assert torch.equal(kc[slots], rk[slots]) and torch.equal(vc[slots], rv[slots])
    untouched = torch.ones(n_slots, dtype=torch.bool)
    untouched[slots] = False
    assert kc[untouched].isnan().all() and vc[untouched].isnan().all()  # nothing written beside the slots
    y = x.double() @ w.double().T + (0 if b is None else b.double())  # the values are the right ones
    torch.testing.assert_close(vc[slots].double(), y[:, (nh + nkv) * d :].reshape(t, nkv, d), rtol=2e-2, atol=2e-2)


def test_bad_input_writes_nothing_and_the_gate() -> None:
    nh, nkv, d, t, k = 4, 2, 8, 16, 24
    x, w, b, cos, sin, _, _, slots, n_slots = _inputs(t, k, nh, nkv, d, False, True, False, seed=60)
    kc, vc = torch.zeros(n_slots, nkv, d), torch.zeros(n_slots, nkv, d)

    def call(**change):
        args = dict(x=x, weight=w, bias=b, bf16dot=False, cos=cos, sin=sin, q_norm=None, k_norm=None, eps=1e-6,
                    num_heads=nh, head_dim=d, k_cache=kc, v_cache=vc, slots=slots)
        return cpu.linear_qkv_rope_to_cache(**{**args, **change})

    bad_slots = slots.clone()
    bad_slots[5] = n_slots
    cases = [(dict(slots=bad_slots), f"slot {n_slots} outside \\[0, {n_slots}\\)"),
             (dict(slots=slots[:-1].contiguous()), f"{t - 1} slots for {t} tokens"),
             (dict(bias=b[:-1].contiguous()), "bias of 63 for 64 outputs"),
             (dict(weight=w[:, :-1].contiguous()), "x has 24 features, weight expects 23"),
             (dict(weight=w[:-8].contiguous(), bias=None), "qkv rows of 56 for 4\\+2x2 heads of 8"),
             (dict(bf16dot=True), "weight must be a contiguous bfloat16"),
             (dict(v_cache=torch.zeros(n_slots, nkv, d + 1)), "k_cache .* for heads of 8")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            call(**change)
        assert not kc.any() and not vc.any()
    assert cpu.use_linear_epilogue(t, w, b, False) and not cpu.use_linear_epilogue(t, w, b, True)  # not the bf16 dot
    assert not cpu.use_linear_epilogue(cpu.MIN_PACKED_ROWS - 1, w, b, False)  # a decode's rows: the unfused path
    assert not cpu.use_linear_epilogue(t, w, b.bfloat16(), False)
    assert not cpu.use_linear_epilogue(t, w.bfloat16(), b, False)  # bf16 weights, fp32 arithmetic: the unfused path
    assert cpu.use_linear_epilogue(t, w.bfloat16(), b, True) == gemm_bf16dot.NATIVE


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bf16dot", BF16DOT)
@pytest.mark.parametrize(("t", "k", "h", "bias"), [(300, 64, 96, False), (257, 77, 40, True), (12, 8, 13, True),
                                                   (129, 512, 512, False)])
def test_fused_add_norm_equals_the_projection_then_add_rms_norm_bitwise(t: int, k: int, h: int, bias: bool,
                                                                        bf16dot: bool, threads: int) -> None:
    a = randn(t, k, seed=70 + t)
    w = randn(h, k, seed=71) * k**-0.5
    w = w.bfloat16() if bf16dot else w
    b = randn(h, seed=72) if bias else None
    x, norm = randn(t, h, seed=73), randn(h, seed=74)
    assert cpu.use_linear_epilogue(t, w, b, bf16dot)
    s, out = with_threads(threads, lambda: cpu.linear_add_rms_norm(a, w, b, bf16dot, x, norm, 1e-5))

    def unfused():
        y = linear_bf16dot(a, w) if bf16dot else cpu.linear(a, w)
        return cpu.add_rms_norm(x, y if b is None else y.add_(b), norm, 1e-5)

    rs, rout = with_threads(threads, unfused)
    assert s.shape == out.shape == (t, h) and torch.isfinite(out).all()
    assert torch.equal(s, rs) and torch.equal(out, rout)
    y = a.double() @ w.double().T + (0 if b is None else b.double())  # the values are the right ones
    torch.testing.assert_close(s.double(), x.double() + y, rtol=2e-2, atol=2e-2)


def test_fused_add_norm_bad_input() -> None:
    a, w, x, norm = randn(16, 8, seed=80), randn(12, 8, seed=81), randn(16, 12, seed=82), randn(12, seed=83)
    cases = [(dict(x=x[:, :-1].contiguous()), "x \\(16, 11\\), norm \\(12,\\) for 16 rows of 12"),
             (dict(norm=norm[:-1].contiguous()), "norm \\(11,\\) for 16 rows of 12"),
             (dict(w=w[:, :-1].contiguous()), "x has 8 features, weight expects 7"),
             (dict(b=randn(11, seed=84)), "bias of 11 for 12 outputs"),
             (dict(x=x.t()), "x must be a contiguous float32")]
    for change, message in cases:
        args = {**dict(a=a, w=w, b=None, x=x, norm=norm), **change}
        with pytest.raises(ValueError, match=message):
            cpu.linear_add_rms_norm(args["a"], args["w"], args["b"], False, args["x"], args["norm"], 1e-5)
