/* execstate CPU kernels, Python module `execstate.kernels._cpu`: bindings and the contracts.
 *
 * Files: gemm.c (small-batch linear, fused MoE), attention.c (paged decode attention),
 * fused.c (RMSNorm, q/k/v + QK-norm + RoPE, SwiGLU gate), simd.h (shared helpers);
 * gemm_packed.c (AVX-512 many-row linear and MoE) and prefill_attention.c (decode attention
 * tiled by span), which keep the 8-lane numerics below bit for bit on 16-lane vectors;
 * gemm_bf16_pairs.c (AVX-512 few-row bf16 linear, gemm_bf16.c's bits at twice the FMA width);
 * scratch.c (per-thread temporaries kept between calls).
 *
 * Why: at decode, a step multiplies a few rows (batch <= 16; an MoE expert sees 1-4 tokens)
 * by large weight matrices. That is memory-bound: the best kernel reads every weight once at
 * DRAM speed. torch's MKL path reaches ~10 GB/s on this kind of call on AMD CPUs; these
 * kernels stream each weight row once for all M rows and reach ~25-30 GB/s on 2 cores.
 *
 * Contracts (callers validate shapes/dtypes/contiguity; see execstate/kernels/cpu.py):
 *   linear: y[M, N] = x[M, K] @ w[N, K]^T; all fp32, row-major, contiguous.
 *   moe:    out[T, H] = sum_j wts[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j],
 *           w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I]; ids int64, wts fp32.
 *   linear_bf16, moe_bf16: the same with bf16 weights (gemm_bf16.c), bitwise equal to
 *           linear / moe on the weights widened to fp32.
 *
 * Numerics: every output element y[m, n] is one dot product computed the same way whatever
 * M, the other rows, the thread count or the code path: 8 fp32 lanes accumulate k = lane
 * (mod 8) in order with FMA, the lanes are summed in a fixed tree, then the K % 8 tail is
 * added in order with fmaf. Results are therefore deterministic and batch-invariant (a row's
 * result does not depend on which rows share its batch). They differ from MKL's by normal
 * fp32 rounding (~1e-6 relative), which is why the engine records the kernel set in its
 * provenance numerics.
 *
 * Threads: OpenMP. Loaded after torch, this module binds to the libgomp torch already
 * loaded (same soname), so it shares torch's thread pool and torch.set_num_threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <omp.h>

#include "decode_layer.h"

PyObject *es_py_mask_logits(PyObject *self, PyObject *args); /* token_mask.c */
#include "kernels.h"

static int cpu_ok(void) {
    static int ok = -1; /* probed once */
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}

static PyObject *py_available(PyObject *self, PyObject *args) { return PyBool_FromLong(cpu_ok()); }

static PyObject *py_max_threads(PyObject *self, PyObject *args) { return PyLong_FromLong(omp_get_max_threads()); }

/* The calling thread's OpenMP team size for its next parallel regions (kernels/team.py). */
static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 1) return PyErr_Format(PyExc_ValueError, "set_threads: n must be >= 1, got %d", n);
    omp_set_num_threads(n);
    Py_RETURN_NONE;
}

/* The bindings of one kernel family share their argument parsing, size checks and return-code
 * handling; each calls its own kernel with the GIL released. */
struct linear_args {
    unsigned long long x, w, y;
    Py_ssize_t M, K, N;
};

static int parse_linear(PyObject *args, const char *name, int need_avx2, struct linear_args *a) {
    if (!PyArg_ParseTuple(args, "KKKnnn", &a->x, &a->w, &a->y, &a->M, &a->K, &a->N)) return 0;
    if (need_avx2 && !cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA"), 0;
    if (a->M < 0 || a->K < 0 || a->N < 0) return PyErr_Format(PyExc_ValueError, "%s: negative size", name), 0;
    return 1;
}

struct moe_args {
    unsigned long long x, ids, wts, wgu, wd, out;
    Py_ssize_t T, k, E, H, I;
};

static int parse_moe(PyObject *args, const char *name, int need_avx2, struct moe_args *a) {
    if (!PyArg_ParseTuple(args, "KKKKKKnnnnn", &a->x, &a->ids, &a->wts, &a->wgu, &a->wd, &a->out, &a->T, &a->k, &a->E,
                          &a->H, &a->I))
        return 0;
    if (need_avx2 && !cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA"), 0;
    if (a->T < 0 || a->k < 1 || a->E < 1 || a->H < 1 || a->I < 1)
        return PyErr_Format(PyExc_ValueError, "%s: bad sizes", name), 0;
    return 1;
}

/* Kernel status -> Python: 0 None, 1 a bad expert id (`id_name`), 2 out of memory, 3 no AVX-512. */
static PyObject *kernel_result(int status, const char *name, const char *id_name, Py_ssize_t E) {
    if (status == 3) return PyErr_Format(PyExc_RuntimeError, "%s needs AVX-512 (avx512f/dq/vl)", name);
    if (status == 2) return PyErr_NoMemory();
    if (status) return PyErr_Format(PyExc_ValueError, "%s: expert id outside [0, %zd)", id_name, E);
    Py_RETURN_NONE;
}

static PyObject *py_linear(PyObject *self, PyObject *args) {
    struct linear_args a;
    int status;
    if (!parse_linear(args, "linear", 1, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_linear_f32((const float *)a.x, (const float *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, "linear", "linear", 0);
}

static PyObject *py_linear_packed(PyObject *self, PyObject *args) {
    struct linear_args a;
    int status;
    if (!parse_linear(args, "linear_packed", 0, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_linear_packed_f32((const float *)a.x, (const float *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status == 3 ? 3 : status ? 2 : 0, "linear_packed", "linear_packed", 0);
}

static PyObject *py_linear_packed_bf16(PyObject *self, PyObject *args) {
    struct linear_args a;
    int status;
    if (!parse_linear(args, "linear_packed_bf16", 0, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_linear_packed_bf16((const float *)a.x, (const uint16_t *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status == 3 ? 3 : status ? 2 : 0, "linear_packed_bf16", "linear_packed_bf16", 0);
}

static PyObject *py_packed_available(PyObject *self, PyObject *args) {
    return PyBool_FromLong(cpu_ok() && es_gemm_packed_available());
}

static PyObject *py_moe_packed(PyObject *self, PyObject *args) {
    struct moe_args a;
    int bad;
    if (!parse_moe(args, "moe_packed", 0, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = es_moe_packed_f32((const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts, (const float *)a.wgu,
                            (const float *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, "moe_packed", "moe", a.E);
}

static PyObject *py_moe_packed_bf16(PyObject *self, PyObject *args) {
    struct moe_args a;
    int bad;
    if (!parse_moe(args, "moe_packed_bf16", 0, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = es_moe_packed_bf16((const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts, (const uint16_t *)a.wgu,
                             (const uint16_t *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, "moe_packed_bf16", "moe_bf16", a.E);
}

static PyObject *py_moe(PyObject *self, PyObject *args) {
    struct moe_args a;
    int bad;
    if (!parse_moe(args, "moe", 1, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = es_moe_f32((const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts, (const float *)a.wgu,
                     (const float *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, "moe", "moe", a.E);
}

/* linear_bf16 / moe_bf16: as linear / moe with the weights as bf16 bit patterns (gemm_bf16.c). */
static PyObject *py_linear_bf16(PyObject *self, PyObject *args) {
    struct linear_args a;
    int status;
    if (!parse_linear(args, "linear_bf16", 1, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_linear_bf16((const float *)a.x, (const uint16_t *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, "linear_bf16", "linear_bf16", 0);
}

static PyObject *py_moe_bf16(PyObject *self, PyObject *args) {
    struct moe_args a;
    int bad;
    if (!parse_moe(args, "moe_bf16", 1, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = es_moe_bf16((const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts, (const uint16_t *)a.wgu,
                      (const uint16_t *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, "moe_bf16", "moe_bf16", a.E);
}

/* bf16 arithmetic (gemm_bf16dot.c; _emu: gemm_bf16dot_emu.c, AVX2). The AVX512-BF16 entries
 * raise RuntimeError where the CPU lacks it. */
static PyObject *linear_u16(PyObject *args, const char *name, int need_bf16,
                            int (*fn)(const float *, const uint16_t *, float *, int64_t, int64_t, int64_t)) {
    struct linear_args a;
    int status;
    if (!parse_linear(args, name, 1, &a)) return NULL;
    if (need_bf16 && !es_bf16dot_available()) return PyErr_Format(PyExc_RuntimeError, "%s needs AVX512-BF16", name);
    Py_BEGIN_ALLOW_THREADS
    status = fn((const float *)a.x, (const uint16_t *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, name, name, 0);
}

static PyObject *moe_u16(PyObject *args, const char *name, int need_bf16,
                         int (*fn)(const float *, const int64_t *, const float *, const uint16_t *, const uint16_t *,
                                   float *, int64_t, int64_t, int64_t, int64_t, int64_t)) {
    struct moe_args a;
    int bad;
    if (!parse_moe(args, name, 1, &a)) return NULL;
    if (need_bf16 && !es_bf16dot_available()) return PyErr_Format(PyExc_RuntimeError, "%s needs AVX512-BF16", name);
    Py_BEGIN_ALLOW_THREADS
    bad = fn((const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts, (const uint16_t *)a.wgu,
             (const uint16_t *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, name, name, a.E);
}

static PyObject *py_linear_bf16dot(PyObject *self, PyObject *args) {
    return linear_u16(args, "linear_bf16dot", 1, es_linear_bf16dot);
}
static PyObject *py_linear_bf16dot_emu(PyObject *self, PyObject *args) {
    return linear_u16(args, "linear_bf16dot_emu", 0, es_linear_bf16dot_emu);
}
static PyObject *py_moe_bf16dot(PyObject *self, PyObject *args) { return moe_u16(args, "moe_bf16dot", 1, es_moe_bf16dot); }
static PyObject *py_moe_bf16dot_emu(PyObject *self, PyObject *args) {
    return moe_u16(args, "moe_bf16dot_emu", 0, es_moe_bf16dot_emu);
}
static PyObject *py_bf16dot_available(PyObject *self, PyObject *args) {
    return PyBool_FromLong(cpu_ok() && es_bf16dot_available());
}

/* GGUF blocks (gemm_gguf.c): linear_gguf(x, w, y, M, K, N, fmt, avx2) and moe_gguf(moe's arguments,
 * fmt, avx2); fmt an ES_FMT_Q* code, K (and H, I) multiples of 32. */
static int gguf_fmt_ok(int fmt) { return fmt == ES_FMT_Q8_0 || fmt == ES_FMT_Q4_0 || fmt == ES_FMT_Q4_1; }
#define GGUF_CPU_OK() (cpu_ok() && es_gguf_available())

static PyObject *py_linear_gguf(PyObject *self, PyObject *args) {
    struct linear_args a;
    int fmt, avx2, status;
    if (!PyArg_ParseTuple(args, "KKKnnnii", &a.x, &a.w, &a.y, &a.M, &a.K, &a.N, &fmt, &avx2)) return NULL;
    if (!GGUF_CPU_OK()) return PyErr_Format(PyExc_RuntimeError, "linear_gguf needs AVX2, FMA and F16C");
    if (a.M < 0 || a.K < 0 || a.N < 0 || a.K % 32 || !gguf_fmt_ok(fmt))
        return PyErr_Format(PyExc_ValueError, "linear_gguf: bad sizes or format");
    Py_BEGIN_ALLOW_THREADS
    status = es_linear_gguf(fmt, avx2, (const float *)a.x, (const uint8_t *)a.w, (float *)a.y, a.M, a.K, a.N);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, "linear_gguf", "linear_gguf", 0);
}

static PyObject *py_moe_gguf(PyObject *self, PyObject *args) {
    struct moe_args a;
    int fmt, avx2, bad;
    if (!PyArg_ParseTuple(args, "KKKKKKnnnnnii", &a.x, &a.ids, &a.wts, &a.wgu, &a.wd, &a.out, &a.T, &a.k, &a.E, &a.H,
                          &a.I, &fmt, &avx2))
        return NULL;
    if (!GGUF_CPU_OK()) return PyErr_Format(PyExc_RuntimeError, "moe_gguf needs AVX2, FMA and F16C");
    if (a.T < 0 || a.k < 1 || a.E < 1 || a.H < 1 || a.I < 1 || a.H % 32 || a.I % 32 || !gguf_fmt_ok(fmt))
        return PyErr_Format(PyExc_ValueError, "moe_gguf: bad sizes or format");
    Py_BEGIN_ALLOW_THREADS
    bad = es_moe_gguf(fmt, avx2, (const float *)a.x, (const int64_t *)a.ids, (const float *)a.wts,
                      (const uint8_t *)a.wgu, (const uint8_t *)a.wd, (float *)a.out, a.T, a.k, a.E, a.H, a.I);
    Py_END_ALLOW_THREADS
    return kernel_result(bad, "moe_gguf", "moe_gguf", a.E);
}

/* decode_attention and prefill_attention take the same arguments (prefill: nh / nkv <= 16), and
 * prefill_attention a last one: kv_bf16 (the caches hold bf16). */
struct attention_args {
    unsigned long long q, kc, vc, out, tok, bt, cl;
    Py_ssize_t B, max_blocks, nh, nkv, d, bs;
    float scale;
    int kv_bf16;
};

static int parse_attention(PyObject *args, const char *name, Py_ssize_t max_group, struct attention_args *a) {
    a->kv_bf16 = 0;
    if (!PyArg_ParseTuple(args, max_group ? "KKKKKKKnnnnnnfi" : "KKKKKKKnnnnnnf", &a->q, &a->kc, &a->vc, &a->out,
                          &a->tok, &a->bt, &a->cl, &a->B, &a->max_blocks, &a->nh, &a->nkv, &a->d, &a->bs, &a->scale,
                          &a->kv_bf16))
        return 0;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA"), 0;
    if (a->B < 0 || a->max_blocks < 1 || a->nkv < 1 || a->nh % a->nkv || (max_group && a->nh / a->nkv > max_group) ||
        a->d < 1 || a->bs < 1)
        return PyErr_Format(PyExc_ValueError, "%s: bad sizes", name), 0;
    return 1;
}

static PyObject *py_decode_attention(PyObject *self, PyObject *args) {
    struct attention_args a;
    int status;
    if (!parse_attention(args, "decode_attention", 0, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_decode_attention_f32((const float *)a.q, (const float *)a.kc, (const float *)a.vc, (float *)a.out,
                                     (const int64_t *)a.tok, (const int64_t *)a.bt, (const int64_t *)a.cl, a.B,
                                     a.max_blocks, a.nh, a.nkv, a.d, a.bs, a.scale);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, "decode_attention", "decode_attention", 0);
}

static PyObject *py_prefill_attention(PyObject *self, PyObject *args) {
    struct attention_args a;
    int status;
    if (!parse_attention(args, "prefill_attention", 16, &a)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = es_prefill_attention_f32((const float *)a.q, (const void *)a.kc, (const void *)a.vc, a.kv_bf16 != 0,
                                      (float *)a.out, (const int64_t *)a.tok, (const int64_t *)a.bt,
                                      (const int64_t *)a.cl, a.B, a.max_blocks, a.nh, a.nkv, a.d, a.bs, a.scale);
    Py_END_ALLOW_THREADS
    return kernel_result(status ? 2 : 0, "prefill_attention", "prefill_attention", 0);
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    Py_ssize_t T, H;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKnnf", &x, &w, &out, &T, &H, &eps)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || H < 1) return PyErr_Format(PyExc_ValueError, "rms_norm: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    es_rms_norm_f32((const float *)x, (const float *)w, (float *)out, T, H, eps);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_add_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, a, w, s, out;
    Py_ssize_t T, H;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKKKnnf", &x, &a, &w, &s, &out, &T, &H, &eps)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || H < 1) return PyErr_Format(PyExc_ValueError, "add_rms_norm: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    es_add_rms_norm_f32((const float *)x, (const float *)a, (const float *)w, (float *)s, (float *)out, T, H, eps);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_qkv_rope(PyObject *self, PyObject *args) {
    unsigned long long qkv, cos, sin, qw, kw, q, k, v, slots = 0;
    Py_ssize_t T, nh, nkv, d, n_slots = 0;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKKKfKKKnnnn|Kn", &qkv, &cos, &sin, &qw, &kw, &eps, &q, &k, &v, &T, &nh, &nkv, &d,
                          &slots, &n_slots))
        return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || nh < 1 || nkv < 1 || d < 2 || d % 2) return PyErr_Format(PyExc_ValueError, "qkv_rope: bad sizes");
    for (Py_ssize_t t = 0; slots && t < T; t++) { /* k and v rows at slots[t] of [n_slots, nkv, d] */
        const int64_t s = ((const int64_t *)slots)[t];
        if (s < 0 || s >= n_slots) return PyErr_Format(PyExc_ValueError, "qkv_rope: slot %lld outside [0, %zd)",
                                                       (long long)s, n_slots);
    }
    Py_BEGIN_ALLOW_THREADS
    es_qkv_rope_f32((const float *)qkv, (const float *)cos, (const float *)sin, (const float *)qw, (const float *)kw, eps,
                 (float *)q, (float *)k, (float *)v, (const int64_t *)slots, T, nh, nkv, d);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_linear_qkv(PyObject *self, PyObject *args) {
    unsigned long long x, w, bias, cos, sin, qw, kw, q, k, v, slots;
    Py_ssize_t M, K, nh, nkv, d, n_slots;
    int bf16dot, status;
    float eps;
    if (!PyArg_ParseTuple(args, "pKKnnKKKKKfKKKKnnnn", &bf16dot, &x, &w, &M, &K, &bias, &cos, &sin, &qw, &kw, &eps, &q,
                          &k, &v, &slots, &n_slots, &nh, &nkv, &d))
        return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (M < 0 || K < 1 || nh < 1 || nkv < 1 || d < 2 || d % 2 || !slots)
        return PyErr_Format(PyExc_ValueError, "linear_qkv: bad sizes");
    for (Py_ssize_t t = 0; t < M; t++) { /* k and v rows at slots[t] of [n_slots, nkv, d] */
        const int64_t s = ((const int64_t *)slots)[t];
        if (s < 0 || s >= n_slots) return PyErr_Format(PyExc_ValueError, "linear_qkv: slot %lld outside [0, %zd)",
                                                       (long long)s, n_slots);
    }
    const EsQkvRope e = {(const float *)bias, (const float *)cos, (const float *)sin, (const float *)qw,
                         (const float *)kw, eps, (float *)q, (float *)k, (float *)v, (const int64_t *)slots, nh, nkv,
                         d};
    Py_BEGIN_ALLOW_THREADS
    status = bf16dot ? es_linear_qkv_bf16dot((const float *)x, (const uint16_t *)w, M, K, &e)
                     : es_linear_qkv_packed_f32((const float *)x, (const float *)w, M, K, &e);
    Py_END_ALLOW_THREADS
    if (status == 3 && bf16dot) return PyErr_Format(PyExc_RuntimeError, "linear_qkv needs AVX512-BF16");
    return kernel_result(status, "linear_qkv", "linear_qkv", 0);
}

static PyObject *py_linear_add_norm(PyObject *self, PyObject *args) {
    unsigned long long a, w, bias, x, nw, s, out;
    Py_ssize_t M, K, H;
    int bf16dot, status;
    float eps;
    if (!PyArg_ParseTuple(args, "pKKnnKKKKKnf", &bf16dot, &a, &w, &M, &K, &bias, &x, &nw, &s, &out, &H, &eps))
        return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (M < 0 || K < 1 || H < 1) return PyErr_Format(PyExc_ValueError, "linear_add_norm: bad sizes");
    const EsAddNorm e = {(const float *)bias, (const float *)x, (const float *)nw, (float *)s, (float *)out, eps, H};
    Py_BEGIN_ALLOW_THREADS
    status = bf16dot ? es_linear_add_norm_bf16dot((const float *)a, (const uint16_t *)w, M, K, &e)
                     : es_linear_add_norm_packed_f32((const float *)a, (const float *)w, M, K, &e);
    Py_END_ALLOW_THREADS
    if (status == 3 && bf16dot) return PyErr_Format(PyExc_RuntimeError, "linear_add_norm needs AVX512-BF16");
    return kernel_result(status, "linear_add_norm", "linear_add_norm", 0);
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    unsigned long long gu, h;
    Py_ssize_t T, I;
    if (!PyArg_ParseTuple(args, "KKnn", &gu, &h, &T, &I)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (T < 0 || I < 1) return PyErr_Format(PyExc_ValueError, "silu_mul: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < T; t++)
        es_silu_mul((const float *)gu + t * 2 * I, (const float *)gu + t * 2 * I + I, (float *)h + t * I, I);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_sigmoid(PyObject *self, PyObject *args) {
    unsigned long long x, y;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "KKn", &x, &y, &n)) return NULL;
    if (!cpu_ok()) return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (n < 0) return PyErr_Format(PyExc_ValueError, "sigmoid: negative size");
    Py_BEGIN_ALLOW_THREADS
    es_sigmoid((const float *)x, (float *)y, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sigmoid", py_sigmoid, METH_VARARGS, "sigmoid(x, y, n): y = 1 / (1 + exp(-x)) elementwise (fp32 data pointers)."},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, w, out, T, H, eps) (fp32 data pointers)."},
    {"add_rms_norm", py_add_rms_norm, METH_VARARGS,
     "add_rms_norm(x, a, w, s, out, T, H, eps): s = x + a (s may be a), out = rms_norm(s) * w (fp32 data pointers)."},
    {"qkv_rope", py_qkv_rope, METH_VARARGS,
     "qkv_rope(qkv, cos, sin, q_norm_w or 0, k_norm_w or 0, eps, q, k, v, T, nh, nkv, d[, slots, n_slots]) (fp32 data "
     "pointers; with slots (int64 [T]) token t's k and v rows go to row slots[t] of k and v, [n_slots, nkv, d])."},
    {"linear_qkv", py_linear_qkv, METH_VARARGS,
     "linear_qkv(bf16dot, x, w, M, K, bias or 0, cos, sin, q_norm_w or 0, k_norm_w or 0, eps, q, k_cache, v_cache, "
     "slots, n_slots, nh, nkv, d): the q/k/v linear (linear_packed, or linear_bf16dot when bf16dot) with the bias add "
     "and qkv_rope's work with slots as its epilogue; no product tensor."},
    {"linear_add_norm", py_linear_add_norm, METH_VARARGS,
     "linear_add_norm(bf16dot, a, w, M, K, bias or 0, x, norm_w, s, out, H, eps): y = a @ w.T (+ bias) (linear_packed, "
     "or linear_bf16dot when bf16dot) with add_rms_norm's s = x + y, out = rms_norm(s) * norm_w as its epilogue."},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(gate_up, h, T, I): h = silu(gate) * up per row."},
    {"decode_attention", py_decode_attention, METH_VARARGS,
     "decode_attention(q, k_cache, v_cache, out, tok, block_table, ctx_len, B, max_blocks, nh, nkv, d, bs, scale)."},
    {"prefill_attention", py_prefill_attention, METH_VARARGS,
     "prefill_attention(...): decode_attention's arguments and results, rows of a span tiled together."},
    {"available", py_available, METH_NOARGS, "True when this CPU has AVX2 and FMA."},
    {"max_threads", py_max_threads, METH_NOARGS, "omp_get_max_threads() of the OpenMP runtime in use."},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): omp_set_num_threads(n) on the calling thread."},
    {"linear", py_linear, METH_VARARGS, "linear(x, w, y, M, K, N): y = x @ w.T (fp32 data pointers)."},
    {"linear_packed", py_linear_packed, METH_VARARGS,
     "linear_packed(x, w, y, M, K, N): y = x @ w.T, AVX-512 register-blocked, dot_rows numerics."},
    {"packed_available", py_packed_available, METH_NOARGS, "True when linear_packed can run (AVX-512)."},
    {"moe_packed", py_moe_packed, METH_VARARGS,
     "moe_packed(x, ids, wts, w_gate_up, w_down, out, T, k, E, H, I): moe for many tokens, AVX-512."},
    {"moe", py_moe, METH_VARARGS, "moe(x, ids, wts, w_gate_up, w_down, out, T, k, E, H, I) (data pointers)."},
    {"linear_packed_bf16", py_linear_packed_bf16, METH_VARARGS,
     "linear_packed_bf16(x, w, y, M, K, N): linear_bf16 for many rows, AVX-512 (w bf16)."},
    {"moe_packed_bf16", py_moe_packed_bf16, METH_VARARGS, "moe_packed_bf16(...): moe_bf16 for many tokens, AVX-512."},
    {"linear_bf16", py_linear_bf16, METH_VARARGS, "linear_bf16(x, w, y, M, K, N): y = x @ float(w).T (w bf16)."},
    {"moe_bf16", py_moe_bf16, METH_VARARGS, "moe_bf16(...): moe with bf16 w_gate_up and w_down."},
    {"linear_bf16dot", py_linear_bf16dot, METH_VARARGS,
     "linear_bf16dot(x, w, y, M, K, N): y = bf16(x) @ w.T by vdpbf16ps, bf16 dot order (w bf16)."},
    {"linear_bf16dot_emu", py_linear_bf16dot_emu, METH_VARARGS,
     "linear_bf16dot_emu(...): linear_bf16dot's order with fp32 FMAs (AVX2), for CPUs without AVX512-BF16."},
    {"moe_bf16dot", py_moe_bf16dot, METH_VARARGS, "moe_bf16dot(...): moe with bf16 arithmetic (AVX512-BF16)."},
    {"moe_bf16dot_emu", py_moe_bf16dot_emu, METH_VARARGS, "moe_bf16dot_emu(...): moe_bf16dot on AVX2 + FMA."},
    {"bf16dot_available", py_bf16dot_available, METH_NOARGS, "True when this CPU has AVX512-BF16 (linear_bf16dot)."},
    {"linear_gguf", py_linear_gguf, METH_VARARGS,
     "linear_gguf(x, w, y, M, K, N, fmt, avx2): y = x @ dequant(w).T on GGUF blocks (fmt 3 Q8_0, 4 Q4_0, 5 Q4_1)."},
    {"moe_gguf", py_moe_gguf, METH_VARARGS, "moe_gguf(x, ids, wts, w_gu, w_d, out, T, k, E, H, I, fmt, avx2)."},
    {"layer_spec", es_py_layer_spec, METH_VARARGS, "layer_spec(...): a layer's weights for decode_layer (decode_spec.c)."},
    {"step_spec", es_py_step_spec, METH_VARARGS, "step_spec(...): a decode step's inputs for decode_layer."},
    {"decode_layer", es_py_decode_layer, METH_VARARGS,
     "decode_layer(layer_spec, step_spec, layer, h_out, logits_out, ids_out, wts_out, forced, mask): a whole "
     "decode-step layer (decode_layer.c)."},
    {"mask_logits", es_py_mask_logits, METH_VARARGS,
     "mask_logits(x, fallback, rows, k, bits, words, V): disallowed tokens of rows -> -inf (token_mask.c)."},
    {"route", es_py_route, METH_VARARGS, "route(logits, T, E, k, forced, mask, norm_topk, ids, wts) (decode_moe.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu", "execstate CPU kernels", -1, methods};

PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&module); }
