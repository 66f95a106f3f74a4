/* Decode attention straight on a paged KV cache's block tables. */
#include "kernels.h"
#include "simd.h"

/* Pointer to position l's row of KV head h in a paged cache. */
static inline const float *kv_row(const float *cache, const int64_t *bt, int64_t l, int64_t bs, int64_t nkv,
                                  int64_t h, int64_t d) {
    return cache + ((bt[l / bs] * bs + l % bs) * nkv + h) * d;
}

/* s[l] = dot(q, K_l) * scale for l < L, four positions at a time (independent FMA chains);
 * every score is the same 8-lane dot product + finish whichever path computes it. */
static KT void scores(const float *qg, const float *kc, const int64_t *bt, int64_t L, int64_t bs, int64_t nkv,
                      int64_t h, int64_t d, float scale, float *s) {
    const int64_t d8 = d & ~(int64_t)7;
    int64_t l = 0;
    for (; l + 4 <= L; l += 4) {
        const float *k0 = kv_row(kc, bt, l, bs, nkv, h, d), *k1 = kv_row(kc, bt, l + 1, bs, nkv, h, d);
        const float *k2 = kv_row(kc, bt, l + 2, bs, nkv, h, d), *k3 = kv_row(kc, bt, l + 3, bs, nkv, h, d);
        scores4(qg, k0, k1, k2, k3, d8, d, scale, s + l);
    }
    for (; l < L; l++) s[l] = score1(qg, kv_row(kc, bt, l, bs, nkv, h, d), d8, d, scale);
}

/* o[i] = inv * sum_l s[l] V_l[i] (FMA in l order). Full 64-wide chunks accumulate in
 * registers; other widths in o itself; both round identically. */
static KT void weighted_values(const float *s, const float *vc, const int64_t *bt, int64_t L, int64_t bs,
                               int64_t nkv, int64_t h, int64_t d, float inv, float *o) {
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0, r7 = r0;
        for (int64_t l = 0; l < L; l++) {
            const float *vp = kv_row(vc, bt, l, bs, nkv, h, d) + c;
            const __m256 p = _mm256_set1_ps(s[l]);
            r0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp), r0);
            r1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 8), r1);
            r2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 16), r2);
            r3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 24), r3);
            r4 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 32), r4);
            r5 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 40), r5);
            r6 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 48), r6);
            r7 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 56), r7);
        }
        const __m256 iv = _mm256_set1_ps(inv);
        _mm256_storeu_ps(o + c, _mm256_mul_ps(r0, iv));
        _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(r1, iv));
        _mm256_storeu_ps(o + c + 16, _mm256_mul_ps(r2, iv));
        _mm256_storeu_ps(o + c + 24, _mm256_mul_ps(r3, iv));
        _mm256_storeu_ps(o + c + 32, _mm256_mul_ps(r4, iv));
        _mm256_storeu_ps(o + c + 40, _mm256_mul_ps(r5, iv));
        _mm256_storeu_ps(o + c + 48, _mm256_mul_ps(r6, iv));
        _mm256_storeu_ps(o + c + 56, _mm256_mul_ps(r7, iv));
    }
    if (c == d) return;
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t i = c; i < d; i++) o[i] = 0.0f;
    for (int64_t l = 0; l < L; l++) {
        const float *vp = kv_row(vc, bt, l, bs, nkv, h, d);
        const __m256 p = _mm256_set1_ps(s[l]);
        int64_t i = c;
        for (; i < d8; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + i), _mm256_loadu_ps(o + i)));
        for (; i < d; i++) o[i] = fmaf(s[l], vp[i], o[i]);
    }
    for (int64_t i = c; i < d; i++) o[i] *= inv;
}

/* Decode attention over a paged KV cache, one query token per sequence.
 * q [*, nh, d] (row tok[b] is sequence b's query), k/v caches [slots, nkv, d],
 * block_table [B, max_blocks], ctx_len [B]; out rows tok[b] get softmax(q k^T * scale) v
 * over the sequence's ctx_len cached positions. Query head j uses KV head j / (nh / nkv).
 * One work item per (sequence, query head), so even batch 1 spreads over the threads;
 * scores are fp32, softmax subtracts the max. */
KT int es_decode_attention_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                                   const int64_t *block_table, const int64_t *ctx_len, int64_t B, int64_t max_blocks,
                                   int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale) {
    const int64_t G = nh / nkv;
    int64_t lmax = 0;
    for (int64_t b = 0; b < B; b++) lmax = ctx_len[b] > lmax ? ctx_len[b] : lmax;
    int oom = 0;
#pragma omp parallel if (B * nh * lmax * d >= PARALLEL_MIN_MACS)
    {
        float *sc = malloc(sizeof(float) * (lmax + 1));
        if (!sc) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < B * nh; item++) {
            if (!sc) continue;
            const int64_t b = item / nh, j = item % nh, h = j / G, L = ctx_len[b];
            const int64_t *bt = block_table + b * max_blocks;
            scores(q + (tok[b] * nh + j) * d, kc, bt, L, bs, nkv, h, d, scale, sc);
            const float sum = softmax_numerators(sc, L);
            weighted_values(sc, vc, bt, L, bs, nkv, h, d, 1.0f / sum, out + (tok[b] * nh + j) * d);
        }
        free(sc);
    }
    return oom ? 2 : 0;
}

/* Work items [i0, i1) (item = sequence * nh + query head) of es_decode_attention_f32 on the
 * calling thread, for callers already inside a parallel region (decode_layer.c); `sc`:
 * scratch of max(ctx_len) + 1 floats. Same computation per item, so the same results. */
KT void es_decode_attention_items_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                                      const int64_t *block_table, const int64_t *ctx_len, int64_t max_blocks,
                                      int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale, int64_t i0,
                                      int64_t i1, float *sc) {
    const int64_t G = nh / nkv;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t b = item / nh, j = item % nh, h = j / G, L = ctx_len[b];
        const int64_t *bt = block_table + b * max_blocks;
        scores(q + (tok[b] * nh + j) * d, kc, bt, L, bs, nkv, h, d, scale, sc);
        const float sum = softmax_numerators(sc, L);
        weighted_values(sc, vc, bt, L, bs, nkv, h, d, 1.0f / sum, out + (tok[b] * nh + j) * d);
    }
}
