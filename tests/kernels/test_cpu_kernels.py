"""execstate's C kernels (execstate/kernels/csrc/ via execstate.kernels.cpu).

Oracles: float64 references written here (``x @ w.T``; a per-token, per-slot MoE loop);
the kernels' own numerics contract (every output element computed the same way whatever
the batch, its position in it, the thread count or the micro-kernel path: bitwise batch
invariance); the torch paths of the model (``use_kernels=False``).
"""

from __future__ import annotations

import math
import platform
import shutil
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu, ext
from execstate.model.context import RouteCapture, StepContext
from execstate.model.dense_attention import DenseCausalAttention
from execstate.model.layers import Linear
from execstate.model.loader import load_model
from execstate.model.moe import SparseMoE
from execstate.model.random_models import make_random


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _expect_kernels() -> str | None:
    """Why the kernels may legitimately be missing here, or None if they must be built."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"not x86_64 Linux ({platform.system()} {platform.machine()})"
    if shutil.which("cc") is None:
        return "no C compiler (cc) to build the extension"
    if not {"avx2", "fma"} <= _cpu_flags():
        return "CPU lacks avx2/fma"
    return None


@pytest.mark.kernels_optional
def test_extension_built_and_usable_where_it_can_be() -> None:
    why = _expect_kernels()
    if why is not None:
        pytest.skip(why)
    assert cpu.available(), f"kernels should be built and usable here: {cpu.unavailable_reason()}"
    assert cpu.unavailable_reason() is None
    assert cpu.KERNEL_SET == "cpu-avx2-v2"


def _check_linear(x: torch.Tensor, w: torch.Tensor) -> None:
    y = cpu.linear(x, w)
    assert y.dtype == torch.float32 and y.shape == (x.shape[0], w.shape[0]) and y.is_contiguous()
    ref = x.double() @ w.double().T
    # fp32 dot products: error ~ eps * sqrt(K) * sum |x_k w_k|; a dropped or doubled term
    # (a wrong K % 8 tail, a wrong row) is orders of magnitude larger.
    scale = x.double().abs() @ w.double().abs().T
    tol = 2e-6 * math.sqrt(max(x.shape[1], 1)) * scale + 1e-30
    err = (y.double() - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g} (M, K, N) = {x.shape[0], *w.shape[::-1]}"


# ----------------------------------------------------------------------------------- linear


@pytest.mark.parametrize(("k", "n"), [(37, 13), (5, 1), (1, 3), (8, 4), (16, 7), (64, 9), (3, 8)])
def test_linear_matches_float64_reference_for_every_small_m(k: int, n: int) -> None:
    x, w = randn(17, k, seed=k), randn(n, k, seed=100 + n)
    for m in range(1, 18):
        _check_linear(x[:m].contiguous(), w)


def test_linear_parallel_sizes_and_offset_views_match_reference() -> None:
    # Over PARALLEL_MIN_MACS: the N range is split across threads.
    big_x, w = randn(20, 301, seed=1), randn(263, 301, seed=2)
    for m in (1, 3, 16):
        _check_linear(big_x[:m], w)
    # A contiguous view with a storage offset (rows 4..9 of a larger tensor).
    view = big_x[4:9]
    assert view.storage_offset() > 0 and view.is_contiguous()
    _check_linear(view, w)
    assert torch.equal(cpu.linear(view, w), cpu.linear(view.clone(), w))


def test_linear_empty_edges() -> None:
    w = randn(13, 37, seed=3)
    y = cpu.linear(torch.empty(0, 37), w)
    assert y.shape == (0, 13)
    y = cpu.linear(randn(3, 0, seed=4), torch.empty(5, 0))
    assert y.shape == (3, 5) and torch.equal(y, torch.zeros(3, 5))
    y = cpu.linear(randn(3, 37, seed=5), torch.empty(0, 37))
    assert y.shape == (3, 0)


@pytest.mark.parametrize(("k", "n"), [(37, 13), (301, 263), (1, 3), (8, 5)])
def test_linear_is_batch_invariant_bitwise(k: int, n: int) -> None:
    x, w = randn(16, k, seed=7 * k), randn(n, k, seed=n)
    alone = torch.cat([cpu.linear(x[i : i + 1], w) for i in range(16)])
    for m in range(1, 17):
        # Every row at several positions: the 4x2, 2x4, 1x4 (and, with N % 4, 1x1) paths.
        for start in (0, 5, 11):
            rows = (torch.arange(m) + start) % 16
            y = cpu.linear(x[rows].contiguous(), w)
            assert torch.equal(y, alone[rows]), f"M={m} start={start}: a row depends on its batch"


@pytest.mark.parametrize("k", [37, 5, 64])
def test_linear_weight_rows_are_independent_of_their_group_bitwise(k: int) -> None:
    """A weight row gives the same bits whether it falls in a group of 4 or in the N % 4
    tail, at any offset (the MoE kernel and the thread split hand out such ranges)."""
    x, w = randn(6, k, seed=k + 1), randn(13, k, seed=k + 2)
    for m in (1, 2, 4, 6):
        full = cpu.linear(x[:m], w)
        for start, stop in [(0, 1), (1, 5), (2, 13), (3, 10), (9, 13), (12, 13), (5, 12)]:
            part = cpu.linear(x[:m], w[start:stop].contiguous())
            assert torch.equal(part, full[:, start:stop]), f"M={m} rows {start}:{stop}"


def test_linear_same_bits_with_one_or_two_threads() -> None:
    x, w = randn(16, 301, seed=8), randn(263, 301, seed=9)  # big enough to go parallel
    one = with_threads(1, lambda: [cpu.linear(x[:m], w) for m in (1, 2, 5, 16)])
    two = with_threads(2, lambda: [cpu.linear(x[:m], w) for m in (1, 2, 5, 16)])
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)


def test_linear_differs_from_torch_only_by_rounding() -> None:
    x, w = randn(4, 96, seed=10), randn(64, 96, seed=11)
    torch.testing.assert_close(cpu.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------------------- moe


def _moe_weights(e: int, h: int, i: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    w_gate_up = randn(e, 2 * i, h, seed=seed) / math.sqrt(h)
    w_down = randn(e, h, i, seed=seed + 1) / math.sqrt(i)
    return w_gate_up, w_down


def _moe_reference(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    """float64, token by token and slot by slot."""
    t_count, h = x.shape
    inter = w_gate_up.shape[1] // 2
    out = torch.zeros(t_count, h, dtype=torch.float64)
    for t in range(t_count):
        xt = x[t].double()
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate = w_gate_up[e, :inter].double() @ xt
            up = w_gate_up[e, inter:].double() @ xt
            act = gate * torch.sigmoid(gate) * up
            out[t] += float(weights[t, j]) * (w_down[e].double() @ act)
    return out


def _route(t: int, k: int, e: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.empty(0, k)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    return ids.long().contiguous(), weights.contiguous()


def _check_moe(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    out = cpu.moe(x, ids, weights, w_gate_up, w_down)
    assert out.dtype == torch.float32 and out.shape == x.shape
    ref = _moe_reference(x, ids, weights, w_gate_up, w_down)
    err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    assert err <= 1e-5 * max(1.0, ref.abs().max().item() if ref.numel() else 0.0), f"max err {err:.3g}"
    return out


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize(("h", "inter"), [(37, 13), (74, 43), (8, 3)])
def test_moe_matches_float64_reference(top_k: int, h: int, inter: int) -> None:
    e = 8
    w_gate_up, w_down = _moe_weights(e, h, inter, seed=h + inter)
    x = randn(16, h, seed=top_k)
    for t in (1, 2, 5, 16):
        ids, weights = _route(t, top_k, e, seed=10 * t + top_k)
        _check_moe(x[:t].contiguous(), ids, weights, w_gate_up, w_down)


def test_moe_all_tokens_on_one_expert_and_repeated_slots() -> None:
    e, h, inter = 8, 37, 13
    w_gate_up, w_down = _moe_weights(e, h, inter, seed=3)
    x = randn(9, h, seed=4)
    for k in (1, 2, 3):
        ids = torch.full((9, k), 5, dtype=torch.int64)  # every slot on expert 5
        _, weights = _route(9, k, e, seed=k)
        _check_moe(x, ids, weights, w_gate_up, w_down)
    ids = torch.tensor([[7, 0]] * 9, dtype=torch.int64)  # the first and last experts only
    _check_moe(x, ids, _route(9, 2, e, seed=5)[1], w_gate_up, w_down)


def test_moe_no_tokens() -> None:
    w_gate_up, w_down = _moe_weights(8, 37, 13, seed=5)
    out = cpu.moe(torch.empty(0, 37), torch.empty(0, 2, dtype=torch.int64), torch.empty(0, 2), w_gate_up, w_down)
    assert out.shape == (0, 37) and out.dtype == torch.float32


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("h", "inter"), [(37, 13), (74, 43)])
def test_moe_is_batch_invariant_bitwise(h: int, inter: int, threads: int) -> None:
    e, k = 8, 2
    w_gate_up, w_down = _moe_weights(e, h, inter, seed=6)
    x = randn(16, h, seed=7)
    # 7 of the 8 experts active: with 2 threads the row split then falls inside an expert,
    # so the same weight row takes a different micro-kernel than with one thread.
    ids, weights = _route(16, k, 7, seed=8)
    alone = torch.cat([cpu.moe(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], w_gate_up, w_down)
                       for t in range(16)])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for t_count in (2, 3, 7, 16):
            for start in (0, 9):
                rows = (torch.arange(t_count) + start) % 16
                out = cpu.moe(x[rows].contiguous(), ids[rows].contiguous(), weights[rows].contiguous(),
                              w_gate_up, w_down)
                assert torch.equal(out, alone[rows]), f"T={t_count} start={start}: a token depends on its batch"
    finally:
        torch.set_num_threads(before)


def test_moe_same_bits_with_one_or_two_threads() -> None:
    e, h, inter, k = 8, 74, 43, 3  # 48 slots * 74 * 43 MACs: parallel; 2I and H not multiples of 4
    w_gate_up, w_down = _moe_weights(e, h, inter, seed=9)
    x = randn(16, h, seed=10)
    outs: dict[tuple[int, int], torch.Tensor] = {}
    for active in (8, 7, 5):  # 7 and 5 active experts: the 2-thread split falls inside one
        ids, weights = _route(16, k, active, seed=11)
        for n in (1, 2):
            outs[active, n] = with_threads(
                n, lambda ids=ids, weights=weights: cpu.moe(x, ids, weights, w_gate_up, w_down)
            )
    for active in (8, 7, 5):
        assert torch.equal(outs[active, 1], outs[active, 2]), f"{active} active experts"


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad_id", [-1, 8, 1 << 40])
def test_moe_expert_id_out_of_range_is_a_value_error(bad_id: int) -> None:
    w_gate_up, w_down = _moe_weights(8, 37, 13, seed=12)
    x = randn(4, 37, seed=13)
    ids, weights = _route(4, 2, 8, seed=14)
    ids[2, 1] = bad_id
    before = [t.clone() for t in (x, ids, weights, w_gate_up, w_down)]
    with pytest.raises(ValueError, match=r"expert id outside \[0, 8\)"):
        cpu.moe(x, ids, weights, w_gate_up, w_down)
    for a, b in zip(before, (x, ids, weights, w_gate_up, w_down), strict=True):
        assert torch.equal(a, b)
    # Still usable afterwards.
    ids[2, 1] = 3
    _check_moe(x, ids, weights, w_gate_up, w_down)


def test_linear_bad_input_names_the_argument() -> None:
    x, w = randn(3, 37, seed=15), randn(13, 37, seed=16)
    cases = [
        ((x.double(), w), "x must be a contiguous float32"),
        ((x, w.bfloat16()), "weight must be a contiguous float32"),
        ((x, randn(37, 13, seed=17).t()), r"weight must be .*non-contiguous"),
        ((randn(37, 6, seed=18).t(), w), r"x must be .*non-contiguous"),
        ((x[0], w), "x must be a 2-D tensor"),
        ((x, w[None]), "weight must be a 2-D tensor"),
        ((x[:, :36].contiguous(), w), "x has 36 features, weight expects 37"),
        ((x, torch.empty(13, 37, device="meta")), "weight must be a contiguous float32 CPU tensor"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.linear(*args)
    assert not cpu.use_linear(x.double(), w) and not cpu.use_linear(x, w.t().contiguous().t())
    assert cpu.use_linear(x, w)
    assert cpu.use_linear(randn(cpu.MAX_LINEAR_ROWS + 1, 37, seed=19), w) == cpu.PACKED  # many rows: packed kernel


def test_moe_bad_input_names_the_argument() -> None:
    e, h, inter = 8, 37, 13
    w_gate_up, w_down = _moe_weights(e, h, inter, seed=20)
    x = randn(4, h, seed=21)
    ids, weights = _route(4, 2, e, seed=22)
    good = dict(x=x, ids=ids, weights=weights, w_gate_up=w_gate_up, w_down=w_down)
    cases = [
        (dict(x=x.double()), "x must be a contiguous float32"),
        (dict(x=x.bfloat16()), "x must be a contiguous float32"),
        (dict(weights=weights.double()), "weights must be a contiguous float32"),
        (dict(w_gate_up=w_gate_up.bfloat16()), "w_gate_up must be a contiguous float32"),
        (dict(w_down=w_down.transpose(1, 2).contiguous().transpose(1, 2)), r"w_down must be .*non-contiguous"),
        (dict(x=randn(h, 4, seed=23).t()), r"x must be .*non-contiguous"),
        (dict(ids=ids.int()), "ids must be contiguous int64"),
        (dict(ids=ids.t().contiguous().t()), "ids must be contiguous int64"),
        (dict(ids=ids[:, 0]), "ids must be contiguous int64"),
        (dict(x=x[0]), "x must be a 2-D tensor"),
        (dict(w_gate_up=w_gate_up[0]), "w_gate_up must be a 3-D tensor"),
        (dict(w_down=w_down[None]), "w_down must be a 3-D tensor"),
        (dict(w_down=w_down[:, :, :12].contiguous()), r"inconsistent shapes.*w_down \(8, 37, 12\)"),
        (dict(w_gate_up=w_gate_up[:, :25].contiguous()), r"inconsistent shapes.*w_gate_up \(8, 25, 37\)"),
        (dict(x=x[:, :36].contiguous()), r"inconsistent shapes x \(4, 36\)"),
        (dict(ids=ids[:3].contiguous()), r"ids \(3, 2\) and weights \(4, 2\)"),
        (dict(weights=weights[:, :1].contiguous()), r"ids \(4, 2\) and weights \(4, 1\)"),
        (dict(ids=torch.empty(4, 0, dtype=torch.int64), weights=torch.empty(4, 0)), "moe: bad sizes"),
        (dict(w_gate_up=torch.empty(8, 0, h), w_down=torch.empty(8, h, 0)), "moe: bad sizes"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            cpu.moe(**{**good, **change})
    assert cpu.use_moe(x, w_gate_up) and not cpu.use_moe(x.double(), w_gate_up)
    assert cpu.use_moe(randn(cpu.MAX_MOE_TOKENS + 1, h, seed=24), w_gate_up) == cpu.PACKED


# ---------------------------------------------------------------------------------- threads


def test_one_openmp_runtime_shared_with_torch() -> None:
    gomp = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "libgomp" in line.rsplit("/", 1)[-1]}
    assert len(gomp) == 1, f"several OpenMP runtimes loaded: {sorted(gomp)}"
    (path,) = gomp
    assert Path(path).parent == Path(torch.__file__).parent / "lib", path
    loaded = Path("/proc/self/maps").read_text()
    assert "execstate/kernels/_cpu" in loaded  # the extension itself is mapped


def test_max_threads_follows_torch_set_num_threads() -> None:
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            assert cpu.max_threads() == n == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before


def test_max_threads_follows_torch_in_a_fresh_thread() -> None:
    """OpenMP's thread count is per calling thread; torch applies its setting lazily in each
    thread. A kernel call from a new thread (the async engine's) must not use OpenMP's
    default instead of torch's setting."""
    x, w = randn(2, 8, seed=25), randn(4, 8, seed=26)
    w_gate_up, w_down = _moe_weights(8, 8, 4, seed=27)
    ids, weights = _route(2, 2, 8, seed=28)
    calls = {
        "max_threads": cpu.max_threads,
        # What the C side sees right after a kernel call made first thing in the thread.
        "linear": lambda: (cpu.linear(x, w), ext.lib().max_threads())[1],
        "moe": lambda: (cpu.moe(x, ids, weights, w_gate_up, w_down), ext.lib().max_threads())[1],
    }
    before = torch.get_num_threads()
    seen: dict[tuple[str, int], int] = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for name, call in calls.items():
                worker = threading.Thread(target=lambda name=name, call=call, n=n: seen.update({(name, n): call()}))
                worker.start()
                worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == {(name, n): n for name in calls for n in (1, 2)}


# ------------------------------------------------------------------------------------ model


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory):
    model = load_model(make_random("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe_kernels"), seed=0))
    yield model
    model.use_cpu_kernels(False)


def _moe_blocks(model) -> list[SparseMoE]:
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


def test_use_cpu_kernels_sets_and_clears_every_flag(moe_model) -> None:
    linears = [m for m in moe_model.modules() if isinstance(m, Linear)]
    blocks = _moe_blocks(moe_model)
    assert len(blocks) == moe_model.config.num_moe_layers == 2 and len(linears) >= 10
    try:
        moe_model.use_cpu_kernels(True)
        assert moe_model.kernels
        assert all(m.use_kernels for m in linears + blocks)
    finally:
        moe_model.use_cpu_kernels(False)
    assert not moe_model.kernels
    assert not any(m.use_kernels for m in linears + blocks)


def test_sparse_moe_kernel_vs_torch(moe_model, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_moe = cpu.moe
    monkeypatch.setattr(cpu, "moe", lambda x, *a: calls.append(x.shape[0]) or real_moe(x, *a))
    c = moe_model.config
    for block in _moe_blocks(moe_model):
        for n in (1, 5, 16):
            x = randn(n, c.hidden_size, seed=n + block.moe_index)
            outs, routes = [], []
            for flag in (False, True):
                block.use_kernels = block.router.use_kernels = flag
                capture = RouteCapture(n, c.num_moe_layers, c.top_k)
                with StepContext(torch.arange(n), DenseCausalAttention(), capture) as ctx:
                    outs.append(block(x, ctx))
                routes.append(capture.ids[:, block.moe_index].clone())
            block.use_kernels = block.router.use_kernels = False
            torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-5)
            assert torch.equal(routes[0], routes[1])
    assert calls == [1, 5, 16] * 2  # the kernel ran once per kernel-enabled call, never otherwise


def _counted(calls: dict[str, int], name: str, real):
    def call(*args):
        calls[name] += 1
        return real(*args)

    return call


def test_whole_model_kernel_vs_torch_logits_and_routes(moe_model, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"linear_if_small": 0, "moe": 0, "linear_add_rms_norm": 0}
    for name in calls:
        monkeypatch.setattr(cpu, name, _counted(calls, name, getattr(cpu, name)))
    c = moe_model.config
    ids = torch.randint(3, c.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    results = []
    try:
        for flag in (False, True):
            moe_model.use_cpu_kernels(flag)
            capture = RouteCapture(len(ids), c.num_moe_layers, c.top_k)
            with torch.no_grad(), StepContext(torch.arange(len(ids)), DenseCausalAttention(), capture) as ctx:
                logits = moe_model.compute_logits(moe_model(ids, ctx))
            results.append((logits, capture.ids.clone()))
            if not flag:
                assert calls == {"linear_if_small": 0, "moe": 0, "linear_add_rms_norm": 0}
    finally:
        moe_model.use_cpu_kernels(False)
    (ref_logits, ref_routes), (k_logits, k_routes) = results
    # Every Linear module (attention, dense MLP, routers) once, the LM head once and each MoE
    # block once ran on the kernels; on AVX-512 each o-proj with the next norm (linear_add_rms_norm).
    n_linear = sum(isinstance(m, Linear) for m in moe_model.modules())
    o_proj = c.num_layers if cpu.PACKED else 0
    assert calls == {"linear_if_small": n_linear + 1 - o_proj, "moe": c.num_moe_layers, "linear_add_rms_norm": o_proj}
    torch.testing.assert_close(k_logits, ref_logits, rtol=0, atol=1e-4)
    assert torch.equal(k_routes, ref_routes)
