/* A whole decoder layer for a decode step (every token one new position of its sequence),
 * in one call and one OpenMP fork: the same computations as the per-op kernel path
 * (model/layers.py and the kernels/ wrappers), element for element, so every result is bitwise
 * equal to it and keeps its batch invariance (see module.c). What the call saves is the Python
 * around the kernels (~15 wrapper calls, tensor allocations and torch ops per layer) and all
 * but one of the per-kernel forks (barriers instead, 4-5 per layer).
 *
 *   hn  = rms_norm(x, in_norm)                       fused.c
 *   qkv = hn @ w_qkv^T (+ b_qkv)                     gemm.c
 *   q, k, v = split + per-head QK-norm + RoPE         fused.c
 *   K/V written at slots[t] of the layer's cache
 *   att = paged decode attention over block tables    attention.c
 *   x  += att @ w_o^T (+ b_o)
 *   h   = rms_norm(x, post_norm)                      (into h_out when given)
 *   then one of: router logits = h @ w_router^T (MoE layer: the caller routes and runs the
 *   experts), or x += down(silu(gate) * up) with w_gu [2I, H], w_d [H, I] (dense layer),
 *   or nothing.
 *
 * Each matrix is multiplied by its format's row kernel (bf16 widened: gemm_bf16.c; bf16
 * arithmetic: gemm_bf16dot.c; GGUF blocks: gemm_gguf.c), the dot products of that format's
 * per-op kernel, so the layer equals the per-op path in every format bit for bit too.
 *
 * Callers validate every pointer and size (execstate/kernels/decode_layer.py). */
#include "decode_layer.h" /* Python.h first */

#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "step_clock.h"

enum { W_QKV, W_O, W_ROUTER, W_GU, W_D };

/* Weight rows [lo, hi) of the layer's matrix `which` (w, K columns) for its T rows xr, by the
 * row kernel of the matrix's format. */
static KT inline void rows(const EsDecodeLayer *a, int which, const float *const *xr, float *const *yr, const void *w,
                           int64_t K, int64_t lo, int64_t hi) {
    switch (a->fmt[which]) {
    case ES_FMT_BF16:
        es_linear_rows_bf16(xr, yr, a->T, w, K, lo, hi);
        break;
    case ES_FMT_BF16_DOT:
        if (es_bf16dot_available())
            es_linear_rows_bf16dot(xr, yr, a->T, w, K, lo, hi);
        else
            es_linear_rows_bf16dot_emu(xr, yr, a->T, w, K, lo, hi);
        break;
    case ES_FMT_Q8_0:
    case ES_FMT_Q4_0:
    case ES_FMT_Q4_1:
        es_gguf_rows(a->fmt[which], 0)(xr, yr, a->T, w, K, lo, hi);
        break;
    default:
        es_linear_rows_f32(xr, yr, a->T, (const float *)w, K, lo, hi);
    }
}

/* One fork per layer and 4 barriers (5 with a dense MLP). The row-wise steps that feed a
 * linear (the two RMSNorms, SwiGLU) are computed by every thread into its own buffer (the
 * same function on the same inputs, so the same bits) instead of being shared behind a
 * barrier; each thread adds the residual to the columns of x its share of the output
 * projection / down projection produced. Every element is computed exactly as the kernel it
 * stands for computes it (es_linear_f32's dot products, es_qkv_rope_f32's per-token work,
 * the attention work items), so no split changes a result. */
KT int es_decode_layer(const EsDecodeLayer *a) {
    const int64_t T = a->T, H = a->H, nh = a->nh, nkv = a->nkv, d = a->d, I = a->I, E = a->E;
    const int64_t qkv_n = (nh + 2 * nkv) * d;
    int64_t lmax = 0;
    for (int64_t t = 0; t < T; t++) lmax = a->ctx_len[t] > lmax ? a->ctx_len[t] : lmax;
    const int64_t nthreads = omp_get_max_threads();
    /* per thread: hn, h [T, H], act [T, I], attention scores [lmax + 1], padded to 64 bytes */
    const int64_t per_thread = (2 * T * H + T * I + lmax + 1 + 15) & ~(int64_t)15;
    const int64_t shared = T * (qkv_n + nh * d + 2 * nkv * d + nh * d + H + (a->w_gu ? 2 * I + H : 0));
    const size_t bytes[3] = {sizeof(float) * (size_t)(shared + nthreads * per_thread),
                             sizeof(float *) * (size_t)(3 * T * nthreads + T), sizeof(float *) * (size_t)(4 * T)};
    void *pt[3];
    if (es_scratch_parts(ES_SCRATCH_LAYER, 3, bytes, pt)) return 2;
    float *buf = pt[0];
    const float **xr = pt[1];
    float **yr = pt[2];
    float *qkv = buf, *q = qkv + T * qkv_n, *k = q + T * nh * d, *v = k + T * nkv * d;
    float *att = v + T * nkv * d, *o = att + T * nh * d, *gu = o + T * H, *y = gu + (a->w_gu ? 2 * I * T : 0);
    float *priv = buf + shared;
    const float **att_r = xr + 3 * T * nthreads;
    /* Output rows of the four linears: qkv, o, gu / logits, y. */
    for (int64_t t = 0; t < T; t++) {
        att_r[t] = att + t * nh * d;
        yr[t] = qkv + t * qkv_n;
        yr[T + t] = o + t * H;
        yr[2 * T + t] = a->w_router ? a->logits_out + t * E : gu + t * 2 * I;
        yr[3 * T + t] = y + t * H;
    }
    const int64_t macs = T * H * (qkv_n + nh * d + (a->w_gu ? 3 * I : E)) + T * nh * lmax * d;
    const int cpu = a->timer_cpu;
    const double t_entry = a->timers ? es_now_ns(cpu) : 0.0;
    double t_end0 = 0.0;
#pragma omp parallel if (macs >= PARALLEL_MIN_MACS)
    {
        const int tid = omp_get_thread_num();
        double *row = a->timers && tid < a->timer_threads ? a->timers + tid * ES_T_COUNT : NULL;
        /* the fork as the calling thread sees it; on the CPU clock another thread's starts at 0 */
        EsClock c = es_clock(row, tid == 0 || !cpu ? t_entry : (row ? es_now_ns(cpu) : 0.0), cpu);
        es_lap(&c, ES_T_FORK);
        float *hn = priv + tid * per_thread, *h = hn + T * H, *act = h + T * H, *sc = act + T * I;
        if (tid == 0 && a->h_out) h = a->h_out; /* thread 0's post-norm rows are the caller's */
        const float **hn_r = xr + 3 * T * tid, **h_r = hn_r + T, **act_r = h_r + T;
        for (int64_t t = 0; t < T; t++) {
            hn_r[t] = hn + t * H; h_r[t] = h + t * H; act_r[t] = act + t * I;
        }
        int64_t lo, hi;
        es_rms_norm_f32(a->x, a->in_norm, hn, T, H, a->eps);
        es_lap(&c, ES_T_NORM);
        share(qkv_n, &lo, &hi);
        rows(a, W_QKV, hn_r, yr, a->w_qkv, H, lo, hi);
        es_lap(&c, ES_T_QKV);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
#pragma omp for schedule(static) nowait
        for (int64_t t = 0; t < T; t++) {
            float *row = qkv + t * qkv_n;
            if (a->b_qkv)
                for (int64_t n = 0; n < qkv_n; n++) row[n] += a->b_qkv[n];
            es_qkv_rope_f32(row, a->cos + t * d, a->sin + t * d, a->q_norm, a->k_norm, a->eps, q + t * nh * d,
                            k + t * nkv * d, v + t * nkv * d, 1, nh, nkv, d);
            memcpy(a->k_cache + a->slots[t] * nkv * d, k + t * nkv * d, sizeof(float) * nkv * d);
            memcpy(a->v_cache + a->slots[t] * nkv * d, v + t * nkv * d, sizeof(float) * nkv * d);
        }
        es_lap(&c, ES_T_ROPE);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
#pragma omp for schedule(static) nowait
        for (int64_t item = 0; item < T * nh; item++)
            es_decode_attention_items_f32(q, a->k_cache, a->v_cache, att, a->tok, a->block_table, a->ctx_len,
                                          a->max_blocks, nh, nkv, d, a->block_size, a->scale, item, item + 1, sc);
        es_lap(&c, ES_T_ATTN);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
        share(H, &lo, &hi);
        rows(a, W_O, att_r, yr + T, a->w_o, nh * d, lo, hi);
        for (int64_t t = 0; t < T; t++) {
            float *xt = a->x + t * H, *ot = o + t * H;
            for (int64_t n = lo; n < hi; n++) {
                if (a->b_o) ot[n] += a->b_o[n];
                xt[n] = xt[n] + ot[n];
            }
        }
        es_lap(&c, ES_T_O);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
        es_rms_norm_f32(a->x, a->post_norm, h, T, H, a->eps);
        es_lap(&c, ES_T_NORM);
        if (a->w_router) {
            share(E, &lo, &hi);
            rows(a, W_ROUTER, h_r, yr + 2 * T, a->w_router, H, lo, hi);
            es_lap(&c, ES_T_ROUTER);
        } else if (a->w_gu) {
            share(2 * I, &lo, &hi);
            rows(a, W_GU, h_r, yr + 2 * T, a->w_gu, H, lo, hi);
            es_lap(&c, ES_T_MLP);
#pragma omp barrier
            es_lap(&c, ES_T_BARRIER);
            for (int64_t t = 0; t < T; t++) es_silu_mul(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
            share(H, &lo, &hi);
            rows(a, W_D, act_r, yr + 3 * T, a->w_d, I, lo, hi);
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = lo; n < hi; n++) a->x[t * H + n] = a->x[t * H + n] + y[t * H + n];
            es_lap(&c, ES_T_MLP);
        }
        if (tid == 0) t_end0 = c.t;
    }
    if (a->timers && t_end0 > 0.0) a->timers[ES_T_JOIN] += es_now_ns(cpu) - t_end0;
    return 0;
}

/* decode_layer(x, in_norm, w_qkv, b_qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, slots, tok,
 *              block_table, ctx_len, w_o, b_o, post_norm, h_out, w_router, logits_out, w_gu, w_d,
 *              T, H, nh, nkv, d, max_blocks, block_size, E, I, eps, scale, formats[, timers, timer_threads,
 *              timer_cpu]):
 * data pointers (0 = absent); formats: the ES_FMT_* of w_qkv, w_o, w_router, w_gu, w_d in 4 bits
 * each, w_qkv lowest; timers: float64 [timer_threads, ES_T_COUNT] the phase times are added to
 * (0: timers off), timer_cpu: 1 each thread's CPU time, 0 wall time (step_clock.h). */
PyObject *es_py_decode_layer(PyObject *self, PyObject *args) {
    unsigned long long p[22], timers = 0;
    EsDecodeLayer a;
    int st, formats;
    a.timer_threads = 0;
    a.timer_cpu = 0;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKKKKKKKKKKKnnnnnnnnnffi|Kni", &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6],
                          &p[7], &p[8], &p[9], &p[10], &p[11], &p[12], &p[13], &p[14], &p[15], &p[16], &p[17], &p[18],
                          &p[19], &p[20], &p[21], &a.T, &a.H, &a.nh, &a.nkv, &a.d, &a.max_blocks, &a.block_size, &a.E,
                          &a.I, &a.eps, &a.scale, &formats, &timers, &a.timer_threads, &a.timer_cpu))
        return NULL;
    a.timers = (double *)timers;
    if (a.timer_threads < 0 || (timers && a.timer_threads < 1))
        return PyErr_Format(PyExc_ValueError, "decode_layer: timers need timer_threads >= 1");
    for (int j = 0; j < 5; j++) {
        a.fmt[j] = (formats >> (4 * j)) & 15;
        if (a.fmt[j] >= ES_FMT_COUNT) return PyErr_Format(PyExc_ValueError, "decode_layer: bad weight format");
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (a.T < 0 || a.H < 1 || a.nh < 1 || a.nkv < 1 || a.nh % a.nkv || a.d < 2 || a.d % 2 || a.max_blocks < 1 ||
        a.block_size < 1 || a.E < 0 || a.I < 0)
        return PyErr_Format(PyExc_ValueError, "decode_layer: bad sizes");
    a.x = (float *)p[0]; a.in_norm = (const float *)p[1]; a.w_qkv = (const void *)p[2]; a.b_qkv = (const float *)p[3];
    a.q_norm = (const float *)p[4]; a.k_norm = (const float *)p[5]; a.cos = (const float *)p[6];
    a.sin = (const float *)p[7]; a.k_cache = (float *)p[8]; a.v_cache = (float *)p[9];
    a.slots = (const int64_t *)p[10]; a.tok = (const int64_t *)p[11]; a.block_table = (const int64_t *)p[12];
    a.ctx_len = (const int64_t *)p[13]; a.w_o = (const void *)p[14]; a.b_o = (const float *)p[15];
    a.post_norm = (const float *)p[16]; a.h_out = (float *)p[17]; a.w_router = (const void *)p[18];
    a.logits_out = (float *)p[19]; a.w_gu = (const void *)p[20]; a.w_d = (const void *)p[21];
    if (a.T == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    st = es_decode_layer(&a);
    Py_END_ALLOW_THREADS
    if (st) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
