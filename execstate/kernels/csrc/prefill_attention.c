/* Prefill attention straight on a paged KV cache's block tables: the decode kernel's contract
 * and, bit for bit, its results (attention.c), for many query rows of one sequence at a time.
 *
 * Same inputs as es_decode_attention_f32: entry b is query row tok[b] attending to the first
 * ctx_len[b] positions of block table row b. Consecutive entries with the same block table
 * row (a prefill span: PagedDecode.for_spans) form a tile of up to QT rows; a work item is a
 * tile and one KV head, its G query heads together. The item walks the context one cache
 * block at a time, so each block's K and V rows are read from memory once for all of the
 * item's rows (the decode kernel reads them once per row and head).
 *
 * Numerics per (row, head) are exactly the decode kernel's: each score is the 8-lane dot
 * product + finish, times scale; softmax_numerators is the same code; the output is
 * acc = 0, acc = fma(p_l, V_l, acc) for l in order (here kept in memory between blocks: fp32
 * stores are exact), times 1 / sum. So a row's output does not depend on its tile, the
 * thread count or whether it ran as prefill or decode. */
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define QT 8 /* rows per tile */

/* s[l] = dot(q, K_l) * scale for l in [l0, l1) of one cache block starting at kb (rows of
 * stride kstride floats, position l0 at kb): the decode kernel's scores, four at a time. */
static KT void block_scores(const float *qg, const float *kb, int64_t kstride, int64_t l0, int64_t l1, int64_t d,
                            float scale, float *s) {
    const int64_t d8 = d & ~(int64_t)7;
    int64_t l = l0;
    for (; l + 4 <= l1; l += 4) {
        const float *k0 = kb + (l - l0) * kstride, *k1 = k0 + kstride, *k2 = k1 + kstride, *k3 = k2 + kstride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), qv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + i), qv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + i), qv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + i), qv, a3);
        }
        s[l] = finish(a0, k0, qg, d8, d) * scale;
        s[l + 1] = finish(a1, k1, qg, d8, d) * scale;
        s[l + 2] = finish(a2, k2, qg, d8, d) * scale;
        s[l + 3] = finish(a3, k3, qg, d8, d) * scale;
    }
    for (; l < l1; l++) {
        const float *k0 = kb + (l - l0) * kstride;
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), _mm256_loadu_ps(qg + i), a0);
        s[l] = finish(a0, k0, qg, d8, d) * scale;
    }
}

/* attention.c's softmax_numerators, verbatim: s[l] <- exp(s[l] - max), returns the sum. */
static KT float numerators(float *s, int64_t L) {
    float mx = -INFINITY;
    for (int64_t l = 0; l < L; l++) mx = s[l] > mx ? s[l] : mx;
    int64_t l = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; l + 8 <= L; l += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(s + l, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; l < L; l++) {
        s[l] = exp1(s[l] - mx);
        sum += s[l];
    }
    return sum;
}

/* o[i] = fma(s[l], V_l[i], o[i]) for l in [l0, l1) in order (rows of one cache block). */
static KT void block_values(const float *s, const float *vb, int64_t vstride, int64_t l0, int64_t l1, int64_t d,
                            float *o) {
    const int64_t d8 = d & ~(int64_t)7;
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 r0 = _mm256_loadu_ps(o + c), r1 = _mm256_loadu_ps(o + c + 8), r2 = _mm256_loadu_ps(o + c + 16);
        __m256 r3 = _mm256_loadu_ps(o + c + 24), r4 = _mm256_loadu_ps(o + c + 32), r5 = _mm256_loadu_ps(o + c + 40);
        __m256 r6 = _mm256_loadu_ps(o + c + 48), r7 = _mm256_loadu_ps(o + c + 56);
        for (int64_t l = l0; l < l1; l++) {
            const float *vp = vb + (l - l0) * vstride + c;
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
        _mm256_storeu_ps(o + c, r0); _mm256_storeu_ps(o + c + 8, r1);
        _mm256_storeu_ps(o + c + 16, r2); _mm256_storeu_ps(o + c + 24, r3);
        _mm256_storeu_ps(o + c + 32, r4); _mm256_storeu_ps(o + c + 40, r5);
        _mm256_storeu_ps(o + c + 48, r6); _mm256_storeu_ps(o + c + 56, r7);
    }
    for (int64_t l = l0; c < d && l < l1; l++) {
        const float *vp = vb + (l - l0) * vstride;
        const __m256 p = _mm256_set1_ps(s[l]);
        int64_t i = c;
        for (; i < d8; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + i), _mm256_loadu_ps(o + i)));
        for (; i < d; i++) o[i] = fmaf(s[l], vp[i], o[i]);
    }
}

/* One tile (entries e0..e0+n-1, same block table row bt) and KV head h: G heads per row. */
static KT void tile_item(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                         const int64_t *bt, const int64_t *ctx_len, int64_t e0, int64_t n, int64_t h, int64_t G,
                         int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale, int64_t lmax, float *sc,
                         float *oacc) {
    const int64_t rows = n * G, stride = nkv * d;
    int64_t L = 0;
    for (int64_t i = 0; i < n; i++) L = ctx_len[e0 + i] > L ? ctx_len[e0 + i] : L;
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* scores, block by block */
        const float *kb = kc + (bt[b0 / bs] * bs * nkv + h) * d;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t e = e0 + r / G, j = h * G + r % G, l1 = ctx_len[e] < b0 + bs ? ctx_len[e] : b0 + bs;
            if (l1 > b0) block_scores(q + (tok[e] * nh + j) * d, kb, stride, b0, l1, d, scale, sc + r * lmax);
        }
    }
    float inv[QT * 16];
    for (int64_t r = 0; r < rows; r++) inv[r] = 1.0f / numerators(sc + r * lmax, ctx_len[e0 + r / G]);
    memset(oacc, 0, sizeof(float) * rows * d);
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* values, block by block */
        const float *vb = vc + (bt[b0 / bs] * bs * nkv + h) * d;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t e = e0 + r / G, l1 = ctx_len[e] < b0 + bs ? ctx_len[e] : b0 + bs;
            if (l1 > b0) block_values(sc + r * lmax, vb, stride, b0, l1, d, oacc + r * d);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t e = e0 + r / G, j = h * G + r % G;
        float *o = out + (tok[e] * nh + j) * d;
        const __m256 iv = _mm256_set1_ps(inv[r]);
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(oacc + r * d + i), iv));
        for (; i < d; i++) o[i] = oacc[r * d + i] * inv[r];
    }
}

/* Returns 0, or 2 when out of memory (then nothing is guaranteed written). Heads per KV head
 * G = nh / nkv must be at most 16. */
KT int es_prefill_attention_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                                const int64_t *block_table, const int64_t *ctx_len, int64_t B, int64_t max_blocks,
                                int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale) {
    const int64_t G = nh / nkv;
    int64_t lmax = 1, n_tiles = 0;
    for (int64_t b = 0; b < B; b++) lmax = ctx_len[b] > lmax ? ctx_len[b] : lmax;
    int64_t *tile_start = malloc(sizeof(int64_t) * (B + 1));
    if (!tile_start) return 2;
    for (int64_t b = 0; b < B; b++) { /* a new tile at a new table row or after QT rows */
        const int64_t *row = block_table + b * max_blocks;
        if (b == 0 || b - tile_start[n_tiles - 1] >= QT || memcmp(row, row - max_blocks, sizeof(int64_t) * max_blocks))
            tile_start[n_tiles++] = b;
    }
    tile_start[n_tiles] = B;
    int oom = 0;
#pragma omp parallel if (B * nh * lmax * d >= PARALLEL_MIN_MACS)
    {
        float *sc = malloc(sizeof(float) * QT * G * lmax), *oacc = malloc(sizeof(float) * QT * G * d);
        if (!sc || !oacc) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_tiles * nkv; item++) {
            if (!sc || !oacc) continue;
            const int64_t t = item / nkv, h = item % nkv, e0 = tile_start[t];
            tile_item(q, kc, vc, out, tok, block_table + e0 * max_blocks, ctx_len, e0, tile_start[t + 1] - e0, h,
                      G, nh, nkv, d, bs, scale, lmax, sc, oacc);
        }
        free(sc);
        free(oacc);
    }
    free(tile_start);
    return oom ? 2 : 0;
}
