/* A whole decoder layer for a decode step (every token one new position of its sequence),
 * in one call: the same kernels, in the same order, as the per-op path
 * (model/layers.py and the kernels/ wrappers), so every result is bitwise equal to it and keeps its
 * batch invariance (see module.c). What the call saves is the Python around the kernels:
 * ~15 wrapper calls, tensor allocations and torch ops per layer.
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
 * Callers validate every pointer and size (execstate/kernels/decode_layer.py). */
#include "decode_layer.h" /* Python.h first */

#include <string.h>

#include "kernels.h"
#include "simd.h"

static void add_rows(float *y, const float *b, int64_t T, int64_t N) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) y[t * N + n] += b[n];
}

/* y[i] = x[i] + y[i]: the residual add (one fp32 rounding, as torch's x + y). */
static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

KT int es_decode_layer_f32(const EsDecodeLayer *a) {
    const int64_t T = a->T, H = a->H, nh = a->nh, nkv = a->nkv, d = a->d, I = a->I;
    const int64_t qkv_n = (nh + 2 * nkv) * d;
    const int64_t need = T * (H + qkv_n + nh * d + 2 * nkv * d + nh * d + H + H + (a->w_gu ? 3 * I + H : 0));
    float *buf = malloc(sizeof(float) * (need > 0 ? need : 1));
    if (!buf) return 2;
    float *hn = buf, *qkv = hn + T * H, *q = qkv + T * qkv_n, *k = q + T * nh * d, *v = k + T * nkv * d;
    float *att = v + T * nkv * d, *o = att + T * nh * d, *h = o + T * H, *gu = h + T * H;
    float *act = gu + 2 * I * T, *y = act + I * T;
    int st = 0;
    if (a->h_out) h = a->h_out;

    es_rms_norm_f32(a->x, a->in_norm, hn, T, H, a->eps);
    if ((st = es_linear_f32(hn, a->w_qkv, qkv, T, H, qkv_n))) goto done;
    if (a->b_qkv) add_rows(qkv, a->b_qkv, T, qkv_n);
    es_qkv_rope_f32(qkv, a->cos, a->sin, a->q_norm, a->k_norm, a->eps, q, k, v, T, nh, nkv, d);
    for (int64_t t = 0; t < T; t++) {
        memcpy(a->k_cache + a->slots[t] * nkv * d, k + t * nkv * d, sizeof(float) * nkv * d);
        memcpy(a->v_cache + a->slots[t] * nkv * d, v + t * nkv * d, sizeof(float) * nkv * d);
    }
    if ((st = es_decode_attention_f32(q, a->k_cache, a->v_cache, att, a->tok, a->block_table, a->ctx_len, T,
                                      a->max_blocks, nh, nkv, d, a->block_size, a->scale)))
        goto done;
    if ((st = es_linear_f32(att, a->w_o, o, T, nh * d, H))) goto done;
    if (a->b_o) add_rows(o, a->b_o, T, H);
    add_into(a->x, o, T * H);
    es_rms_norm_f32(a->x, a->post_norm, h, T, H, a->eps);
    if (a->w_router) {
        st = es_linear_f32(h, a->w_router, a->logits_out, T, H, a->E);
    } else if (a->w_gu) {
        if ((st = es_linear_f32(h, a->w_gu, gu, T, H, 2 * I))) goto done;
        for (int64_t t = 0; t < T; t++) es_silu_mul(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
        if ((st = es_linear_f32(act, a->w_d, y, T, I, H))) goto done;
        add_into(a->x, y, T * H);
    }
done:
    free(buf);
    return st;
}

/* decode_layer(x, in_norm, w_qkv, b_qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, slots, tok,
 *              block_table, ctx_len, w_o, b_o, post_norm, h_out, w_router, logits_out, w_gu, w_d,
 *              T, H, nh, nkv, d, max_blocks, block_size, E, I, eps, scale): data pointers (0 = absent). */
PyObject *es_py_decode_layer(PyObject *self, PyObject *args) {
    unsigned long long p[22];
    EsDecodeLayer a;
    int st;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKKKKKKKKKKKnnnnnnnnnff", &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6],
                          &p[7], &p[8], &p[9], &p[10], &p[11], &p[12], &p[13], &p[14], &p[15], &p[16], &p[17], &p[18],
                          &p[19], &p[20], &p[21], &a.T, &a.H, &a.nh, &a.nkv, &a.d, &a.max_blocks, &a.block_size, &a.E,
                          &a.I, &a.eps, &a.scale))
        return NULL;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return PyErr_Format(PyExc_RuntimeError, "execstate CPU kernels need AVX2 and FMA");
    if (a.T < 0 || a.H < 1 || a.nh < 1 || a.nkv < 1 || a.nh % a.nkv || a.d < 2 || a.d % 2 || a.max_blocks < 1 ||
        a.block_size < 1 || a.E < 0 || a.I < 0)
        return PyErr_Format(PyExc_ValueError, "decode_layer: bad sizes");
    a.x = (float *)p[0]; a.in_norm = (const float *)p[1]; a.w_qkv = (const float *)p[2]; a.b_qkv = (const float *)p[3];
    a.q_norm = (const float *)p[4]; a.k_norm = (const float *)p[5]; a.cos = (const float *)p[6];
    a.sin = (const float *)p[7]; a.k_cache = (float *)p[8]; a.v_cache = (float *)p[9];
    a.slots = (const int64_t *)p[10]; a.tok = (const int64_t *)p[11]; a.block_table = (const int64_t *)p[12];
    a.ctx_len = (const int64_t *)p[13]; a.w_o = (const float *)p[14]; a.b_o = (const float *)p[15];
    a.post_norm = (const float *)p[16]; a.h_out = (float *)p[17]; a.w_router = (const float *)p[18];
    a.logits_out = (float *)p[19]; a.w_gu = (const float *)p[20]; a.w_d = (const float *)p[21];
    if (a.T == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    st = es_decode_layer_f32(&a);
    Py_END_ALLOW_THREADS
    if (st) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
