/* A whole decoder layer for a decode step (every token one new position of its sequence),
 * in one call and one OpenMP fork: the same computations as the per-op kernel path
 * (model/layers.py and the kernels/ wrappers), element for element, so every result is bitwise
 * equal to it and keeps its batch invariance (see module.c).
 *
 *   hn  = rms_norm(x, in_norm)                        fused.c
 *   qkv = hn @ w_qkv^T (+ b_qkv), then per head QK-norm + RoPE, K/V written at slots[t]
 *   att = paged decode attention over block tables    prefill_attention.c (one item per KV head)
 *   x  += att @ w_o^T (+ b_o)
 *   h   = rms_norm(x, post_norm)
 *   then one of: x += down(silu(gate) * up) (dense); the router logits into logits_out (the
 *   caller routes); or routing and the experts in the call, x += their weighted sum
 *   (decode_moe.c).
 *
 * The team: the row-wise steps that feed a linear (the RMSNorms, SwiGLU, a MoE layer's router
 * and routing) are computed by every thread into its own buffer (the same function on the same
 * inputs, so the same bits) instead of being shared behind a barrier. The q/k/v rows are shared
 * by whole heads, so the thread that computed a head applies its QK-norm and RoPE and writes its
 * K/V at once. Each thread adds the residual to the columns of x its share of the output / down
 * projection produced. Barriers: after q/k/v, after attention, after the output projection, and
 * one (dense) or two (MoE) in the MLP; the join ends the layer. No split changes a result.
 *
 * Each matrix is multiplied by its format's row kernel (bf16 widened: gemm_bf16.c; bf16
 * arithmetic: gemm_bf16dot.c; GGUF blocks: gemm_gguf.c), the dot products of that format's
 * per-op kernel, so the layer equals the per-op path in every format bit for bit too.
 *
 * Callers validate every pointer and size (decode_spec.c, execstate/kernels/decode_layer.py). */
#include "decode_layer.h" /* Python.h first */

#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "step_clock.h"

enum { W_QKV, W_O, W_ROUTER, W_GU, W_D };

/* Weight rows [lo, hi) of matrix `which` (w, K columns) for M rows xr, by its format's row kernel. */
static KT void rows(const EsLayer *L, int64_t M, int which, const float *const *xr, float *const *yr, const void *w,
                    int64_t K, int64_t lo, int64_t hi) {
    switch (L->fmt[which]) {
    case ES_FMT_BF16:
        es_linear_rows_bf16(xr, yr, M, w, K, lo, hi);
        break;
    case ES_FMT_BF16_DOT:
        if (es_bf16dot_available())
            es_linear_rows_bf16dot(xr, yr, M, w, K, lo, hi);
        else
            es_linear_rows_bf16dot_emu(xr, yr, M, w, K, lo, hi);
        break;
    case ES_FMT_Q8_0:
    case ES_FMT_Q4_0:
    case ES_FMT_Q4_1:
        es_gguf_rows(L->fmt[which], 0)(xr, yr, M, w, K, lo, hi);
        break;
    default:
        es_linear_rows_f32(xr, yr, M, (const float *)w, K, lo, hi);
    }
}

/* This thread's heads [*lo, *hi) of `heads`, as share() splits rows. */
static void share_heads(int64_t heads, int64_t *lo, int64_t *hi) {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    *lo = heads * tid / nt;
    *hi = heads * (tid + 1) / nt;
}

KT int es_decode_layer(const EsLayer *L, const EsStep *S, const EsCall *C) {
    const int64_t T = S->T, H = L->H, nh = L->nh, nkv = L->nkv, d = L->d, E = L->E, k_top = L->top_k;
    const int64_t qkv_n = (nh + 2 * nkv) * d, heads = nh + 2 * nkv;
    const int moe = L->w_router && k_top > 0, router_only = L->w_router && !k_top;
    const int64_t I = L->I, slots = moe ? T * k_top : T; /* rows of the MLP's intermediate */
    int64_t lmax = 0;
    for (int64_t t = 0; t < T; t++) lmax = S->ctx_len[t] > lmax ? S->ctx_len[t] : lmax;
    const int64_t nthreads = omp_get_max_threads();
    /* per thread: hn, h [T, H], act [slots, I], router logits [T, E], attention scores [lmax + 1],
     * its MoE bookkeeping; padded to 64 bytes */
    const int64_t moe_floats = moe ? ((int64_t)es_moe_thread_bytes(T, k_top, E) + 3) / 4 : 0;
    const int64_t moe_at = (2 * T * H + slots * I + T * E + lmax + 1 + 15) & ~(int64_t)15;
    const int64_t per_thread = (moe_at + moe_floats + 15) & ~(int64_t)15;
    const int64_t mlp = L->w_gu ? slots * (2 * I + H) : 0;
    const int64_t shared = (T * (qkv_n + nh * d + 2 * nkv * d + nh * d + H) + mlp + 15) & ~(int64_t)15;
    const size_t bytes[3] = {sizeof(float) * (size_t)(shared + nthreads * per_thread),
                             sizeof(float *) * (size_t)(3 * T * nthreads + T), sizeof(float *) * (size_t)(4 * T)};
    void *pt[3];
    if (es_scratch_parts(ES_SCRATCH_LAYER, 3, bytes, pt)) return 2;
    float *buf = pt[0];
    const float **xr = pt[1];
    float **yr = pt[2];
    float *qkv = buf, *q = qkv + T * qkv_n, *k = q + T * nh * d, *v = k + T * nkv * d;
    float *att = v + T * nkv * d, *o = att + T * nh * d, *gu = o + T * H, *y = gu + (L->w_gu ? 2 * I * slots : 0);
    float *priv = buf + shared;
    char *kc = S->k_base + C->layer * S->layer_bytes, *vc = S->v_base + C->layer * S->layer_bytes;
    const int64_t kv_item = S->kv_bf16 ? 2 : 4; /* bytes of a cached K/V value */
    const float **att_r = xr + 3 * T * nthreads;
    for (int64_t t = 0; t < T; t++) { /* output rows of qkv, o, the router / dense gate-up, dense down */
        att_r[t] = att + t * nh * d;
        yr[t] = qkv + t * qkv_n;
        yr[T + t] = o + t * H;
        yr[2 * T + t] = router_only ? C->logits_out + t * E : gu + t * 2 * I;
        yr[3 * T + t] = y + t * H;
    }
    const int64_t macs = T * H * (qkv_n + nh * d + (L->w_gu ? 3 * I * (moe ? k_top : 1) : E)) + T * nh * lmax * d;
    const int cpu = S->timer_cpu;
    const double t_entry = S->timers ? es_now_ns(cpu) : 0.0;
    double t_end0 = 0.0;
    int status = 0; /* 1 a forced id out of range, 2 a thread's scratch could not grow (written only as such) */
#pragma omp parallel if (macs >= PARALLEL_MIN_MACS)
    {
        const int tid = omp_get_thread_num();
        double *row = S->timers && tid < S->timer_threads ? S->timers + tid * ES_T_COUNT : NULL;
        /* the fork as the calling thread sees it; on the CPU clock another thread's starts at 0 */
        EsClock c = es_clock(row, tid == 0 || !cpu ? t_entry : (row ? es_now_ns(cpu) : 0.0), cpu);
        es_lap(&c, ES_T_FORK);
        float *hn = priv + tid * per_thread, *h = hn + T * H, *act = h + T * H, *lg = act + slots * I;
        float *sc = lg + T * E, *moe_mem = hn + moe_at;
        if (tid == 0 && C->h_out) h = C->h_out; /* thread 0's post-norm rows are the caller's */
        const float **hn_r = xr + 3 * T * tid, **h_r = hn_r + T, **act_r = h_r + T;
        for (int64_t t = 0; t < T; t++) {
            hn_r[t] = hn + t * H; h_r[t] = h + t * H; act_r[t] = act + t * I;
        }
        int64_t lo, hi;
        es_rms_norm_f32(S->x, L->in_norm, hn, T, H, L->eps);
        es_lap(&c, ES_T_NORM);
        share_heads(heads, &lo, &hi);
        rows(L, T, W_QKV, hn_r, yr, L->w_qkv, H, lo * d, hi * d);
        es_lap(&c, ES_T_QKV);
        for (int64_t t = 0; t < T; t++) {
            float *r = qkv + t * qkv_n;
            if (L->b_qkv)
                for (int64_t n = lo * d; n < hi * d; n++) r[n] += L->b_qkv[n];
            for (int64_t hd = lo; hd < hi; hd++) {
                es_qkv_rope_head(qkv, S->cos, S->sin, L->q_norm, L->k_norm, L->eps, q, k, v, t, hd, nh, nkv, d);
                if (hd < nh) continue; /* a K or V head: stored at the token's slot (bf16: rounded) */
                const int64_t g = hd < nh + nkv ? hd - nh : hd - nh - nkv;
                const float *src = (hd < nh + nkv ? k : v) + (t * nkv + g) * d;
                char *dst = (hd < nh + nkv ? kc : vc) + (S->slots[t] * nkv + g) * d * kv_item;
                if (S->kv_bf16)
                    for (int64_t i = 0; i < d; i++) ((uint16_t *)dst)[i] = bf16_rne(src[i]);
                else
                    memcpy(dst, src, sizeof(float) * d);
            }
        }
        es_lap(&c, ES_T_ROPE);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
        if (nh / nkv <= 16) { /* (sequence, KV head) items: each K/V row read once for its query heads */
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t item = 0; item < T * nkv; item++)
                if (es_decode_attention_kv(q, kc, vc, S->kv_bf16, att, S->tok, S->block_table, S->ctx_len,
                                           S->max_blocks, nh, nkv, d, S->block_size, L->scale, lmax, item, item + 1)) {
#pragma omp atomic write
                    status = 2;
                }
        } else {
#pragma omp for schedule(static) nowait
            for (int64_t item = 0; item < T * nh; item++)
                es_decode_attention_items_f32(q, (const float *)kc, (const float *)vc, att, S->tok, S->block_table,
                                              S->ctx_len, S->max_blocks, nh, nkv, d, S->block_size, L->scale, item,
                                              item + 1, sc);
        }
        es_lap(&c, ES_T_ATTN);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
        share(H, &lo, &hi);
        rows(L, T, W_O, att_r, yr + T, L->w_o, nh * d, lo, hi);
        for (int64_t t = 0; t < T; t++) {
            float *xt = S->x + t * H, *ot = o + t * H;
            for (int64_t n = lo; n < hi; n++) {
                if (L->b_o) ot[n] += L->b_o[n];
                xt[n] = xt[n] + ot[n];
            }
        }
        es_lap(&c, ES_T_O);
#pragma omp barrier
        es_lap(&c, ES_T_BARRIER);
        es_rms_norm_f32(S->x, L->post_norm, h, T, H, L->eps);
        es_lap(&c, ES_T_NORM);
        if (moe) {
            EsMoeThread m;
            es_moe_thread_init(&m, moe_mem, T, k_top, E);
            if (es_moe_layer(L, S, C, rows, &m, h_r, lg, gu, act, y, &c)) {
#pragma omp atomic write
                status = 1;
            }
        } else if (router_only) {
            share(E, &lo, &hi);
            rows(L, T, W_ROUTER, h_r, yr + 2 * T, L->w_router, H, lo, hi);
            es_lap(&c, ES_T_ROUTER);
        } else if (L->w_gu) {
            share(2 * I, &lo, &hi);
            rows(L, T, W_GU, h_r, yr + 2 * T, L->w_gu, H, lo, hi);
            es_lap(&c, ES_T_MLP);
#pragma omp barrier
            es_lap(&c, ES_T_BARRIER);
            for (int64_t t = 0; t < T; t++) es_silu_mul(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
            share(H, &lo, &hi);
            rows(L, T, W_D, act_r, yr + 3 * T, L->w_d, I, lo, hi);
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = lo; n < hi; n++) S->x[t * H + n] = S->x[t * H + n] + y[t * H + n];
            es_lap(&c, ES_T_MLP);
        }
        if (tid == 0) t_end0 = c.t;
    }
    if (S->timers && t_end0 > 0.0) S->timers[ES_T_JOIN] += es_now_ns(cpu) - t_end0;
    return status;
}
