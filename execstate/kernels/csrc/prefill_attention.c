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
 * product + finish, times scale; softmax_numerators (simd.h) is the same function; the output is
 * acc = 0, acc = fma(p_l, V_l, acc) for l in order (here kept in memory between blocks: fp32
 * stores are exact), times 1 / sum. So a row's output does not depend on its tile, the
 * thread count or whether it ran as prefill or decode.
 *
 * With AVX-512 and d = 64 (the head-pair path) two rows of a tile run together over the
 * positions both see (pair_scores2, pair_values64x2: each K and V chunk loaded once for four
 * (row, head) accumulators), then each row alone over its own; each row's positions stay in
 * order. The softmax numerators then take 16 lanes at a time (softmax_numerators16: the same
 * bits as simd.h's softmax_numerators).
 *
 * Whole groups of 16 / G rows (G even, dividing 16: a full tile of a prefill span) take the lanes
 * path instead (lanes_rows): the group's 16 (row, head) pairs are the 16 lanes of a vector, so a
 * score is computed with no lane shuffled (keys are broadcast, the decode kernel's 8 lane
 * accumulators are 8 vectors added in hsum8's tree), the softmax is vertical with per-lane
 * lengths, and the values run with each row's own positions in order. */
#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "simd512.h"

#define QT 8 /* rows per tile */
#define CURSOR 8 /* int64s between two threads' cursors: one cache line each */

/* s[l] = dot(q, K_l) * scale for l in [l0, l1) of one cache block starting at kb (rows of
 * stride kstride floats, position l0 at kb): the decode kernel's scores, four at a time. */
static KT void block_scores(const float *qg, const float *kb, int64_t kstride, int64_t l0, int64_t l1, int64_t d,
                            float scale, float *s) {
    const int64_t d8 = d & ~(int64_t)7;
    int64_t l = l0;
    for (; d8 == d && l + 8 <= l1; l += 8) { /* eight keys, their lane sums reduced together */
        const float *k0 = kb + (l - l0) * kstride;
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + i);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + u * kstride + i), qv, a[u]);
        }
        _mm256_storeu_ps(s + l, _mm256_mul_ps(hsum8_x8(a), _mm256_set1_ps(scale)));
    }
    for (; l + 4 <= l1; l += 4) {
        const float *k0 = kb + (l - l0) * kstride, *k1 = k0 + kstride, *k2 = k1 + kstride, *k3 = k2 + kstride;
        scores4(qg, k0, k1, k2, k3, d8, d, scale, s + l);
    }
    for (; l < l1; l++) s[l] = score1(qg, kb + (l - l0) * kstride, d8, d, scale);
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

#define KP __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

/* Two heads (a, b) of one row at once on 16-lane vectors: lanes 0-7 are head a's 8 lanes,
 * 8-15 head b's, each K/V chunk broadcast to both halves; every lane does what the 8-lane
 * code above does, so the results are the same bits. qp: [qa[i:i+8] | qb[i:i+8]] per i. Scores of
 * positions [l0, l1) of the cache block whose first position b0 is at kb. */
static KP void pair_scores(const float *qp, const float *kb, int64_t kstride, int64_t b0,
                           int64_t l0, int64_t l1, int64_t d8, float scale, float *sa, float *sb) {
    int64_t l = l0;
    for (; l + 8 <= l1; l += 8) {
        const float *k0 = kb + (l - b0) * kstride;
        __m512 a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) {
            const __m512 qv = _mm512_loadu_ps(qp + 2 * i);
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++)
                a[u] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(k0 + u * kstride + i)), qv, a[u]);
        }
        /* keys l..l+7 of head a, then of head b (see hsum8_x16 for the lane order) */
        const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        const __m512 r = _mm512_mul_ps(_mm512_permutexvar_ps(order, hsum8_x16(a)), _mm512_set1_ps(scale));
        _mm256_storeu_ps(sa + l, _mm512_castps512_ps256(r));
        _mm256_storeu_ps(sb + l, _mm512_extractf32x8_ps(r, 1));
    }
    for (; l < l1; l++) {
        const float *k0 = kb + (l - b0) * kstride;
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8)
            a0 = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(k0 + i)), _mm512_loadu_ps(qp + 2 * i), a0);
        sa[l] = hsum8(_mm512_castps512_ps256(a0)) * scale;
        sb[l] = hsum8(_mm512_extractf32x8_ps(a0, 1)) * scale;
    }
}

/* pair_scores of two rows' head pairs (qp, qr) at once over the same keys [l0, l1): each K chunk
 * loaded once for both; every score is computed as pair_scores computes it (same bits). */
static KP void pair_scores2(const float *qp, const float *qr, const float *kb, int64_t kstride, int64_t b0,
                            int64_t l0, int64_t l1, int64_t d8, float scale, float *sa, float *sb, float *ra,
                            float *rb) {
    int64_t l = l0;
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (; l + 8 <= l1; l += 8) {
        const float *k0 = kb + (l - b0) * kstride;
        __m512 a[8], c[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) a[u] = c[u] = _mm512_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) {
            const __m512 qv = _mm512_loadu_ps(qp + 2 * i), rv = _mm512_loadu_ps(qr + 2 * i);
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) {
                const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(k0 + u * kstride + i));
                a[u] = _mm512_fmadd_ps(kv, qv, a[u]);
                c[u] = _mm512_fmadd_ps(kv, rv, c[u]);
            }
        }
        const __m512 x = _mm512_mul_ps(_mm512_permutexvar_ps(order, hsum8_x16(a)), _mm512_set1_ps(scale));
        const __m512 y = _mm512_mul_ps(_mm512_permutexvar_ps(order, hsum8_x16(c)), _mm512_set1_ps(scale));
        _mm256_storeu_ps(sa + l, _mm512_castps512_ps256(x));
        _mm256_storeu_ps(sb + l, _mm512_extractf32x8_ps(x, 1));
        _mm256_storeu_ps(ra + l, _mm512_castps512_ps256(y));
        _mm256_storeu_ps(rb + l, _mm512_extractf32x8_ps(y, 1));
    }
    if (l < l1) {
        pair_scores(qp, kb, kstride, b0, l, l1, d8, scale, sa, sb);
        pair_scores(qr, kb, kstride, b0, l, l1, d8, scale, ra, rb);
    }
}

/* o (interleaved [a chunk | b chunk] per 8 floats, d = 64) += p_l V_l for l in [l0, l1), p_l of
 * head a at sa[l], of head b at sb[l]. */
static KP void pair_values64(const float *sa, const float *sb, const float *vb, int64_t vstride, int64_t b0,
                             int64_t l0, int64_t l1, float *o) {
    __m512 r[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) r[c] = _mm512_loadu_ps(o + 16 * c);
    for (int64_t l = l0; l < l1; l++) {
        const float *vp = vb + (l - b0) * vstride;
        const __m512 p = _mm512_insertf32x8(_mm512_set1_ps(sa[l]), _mm256_set1_ps(sb[l]), 1);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) r[c] = _mm512_fmadd_ps(p, _mm512_broadcast_f32x8(_mm256_loadu_ps(vp + 8 * c)), r[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) _mm512_storeu_ps(o + 16 * c, r[c]);
}

/* pair_values64 for two rows (scores sa, sb -> o; ra, rb -> o2) over the same positions [l0, l1)
 * of one block, each V chunk loaded once for both: per row the same FMAs in the same order. */
static KP void pair_values64x2(const float *sa, const float *sb, const float *ra, const float *rb, const float *vb,
                               int64_t vstride, int64_t b0, int64_t l0, int64_t l1, float *o, float *o2) {
    __m512 r[8], t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_loadu_ps(o + 16 * c);
        t[c] = _mm512_loadu_ps(o2 + 16 * c);
    }
    for (int64_t l = l0; l < l1; l++) {
        const float *vp = vb + (l - b0) * vstride;
        const __m512 p = _mm512_insertf32x8(_mm512_set1_ps(sa[l]), _mm256_set1_ps(sb[l]), 1);
        const __m512 pr = _mm512_insertf32x8(_mm512_set1_ps(ra[l]), _mm256_set1_ps(rb[l]), 1);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(vp + 8 * c));
            r[c] = _mm512_fmadd_ps(p, v, r[c]);
            t[c] = _mm512_fmadd_ps(pr, v, t[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        _mm512_storeu_ps(o + 16 * c, r[c]);
        _mm512_storeu_ps(o2 + 16 * c, t[c]);
    }
}

/* softmax_numerators_from's end (simd.h) from l, a multiple of 16 with fewer than 16 positions
 * left: at most one 8-lane chunk, hsum8, then the tail (< 8 positions) exponentiated on one
 * masked vector (exp8 works lane by lane, so each lane is exp1's bits) and added in order. */
static KP inline float softmax_end(float *s, int64_t L, int64_t l, float mx, __m256 acc) {
    if (l + 8 <= L) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(s + l, e);
        acc = _mm256_add_ps(acc, e);
        l += 8;
    }
    float sum = hsum8(acc);
    if (l < L) {
        const __mmask8 k = (__mmask8)((1u << (L - l)) - 1);
        _mm256_mask_storeu_ps(s + l, k, exp8(_mm256_sub_ps(_mm256_maskz_loadu_ps(k, s + l), _mm256_set1_ps(mx))));
        for (; l < L; l++) sum += s[l];
    }
    return sum;
}

/* simd.h's softmax_numerators, the same bits on 16-lane vectors: the max is exact whichever
 * order finds it (vmaxps(x, m) keeps m when x is NaN, as the scalar compare; a +0/-0 tie
 * changes no s - max), each exp16 lane is exp8's, and the 8-lane sum adds the low then the
 * high half of each 16, i.e. the 8-lane chunks in order. */
static KP inline float softmax_numerators16(float *s, int64_t L) {
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    int64_t l = 0;
    for (; l + 16 <= L; l += 16) m16 = _mm512_max_ps(_mm512_loadu_ps(s + l), m16);
    float mx = _mm512_reduce_max_ps(m16);
    for (; l < L; l++) mx = s[l] > mx ? s[l] : mx;
    const __m512 mv = _mm512_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (l = 0; l + 16 <= L; l += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + l), mv));
        _mm512_storeu_ps(s + l, e);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
    }
    return softmax_end(s, L, l, mx, acc);
}

/* softmax_numerators16 of two rows with the same L at once (a head pair of one query row): two
 * independent sum chains in one loop, each row's operations as softmax_numerators16's. */
static KP inline void softmax_numerators16x2(float *s, float *t, int64_t L, float *ss, float *st) {
    __m512 m16 = _mm512_set1_ps(-INFINITY), n16 = m16;
    int64_t l = 0;
    for (; l + 16 <= L; l += 16) {
        m16 = _mm512_max_ps(_mm512_loadu_ps(s + l), m16);
        n16 = _mm512_max_ps(_mm512_loadu_ps(t + l), n16);
    }
    float mx = _mm512_reduce_max_ps(m16), nx = _mm512_reduce_max_ps(n16);
    for (; l < L; l++) {
        mx = s[l] > mx ? s[l] : mx;
        nx = t[l] > nx ? t[l] : nx;
    }
    const __m512 mv = _mm512_set1_ps(mx), nv = _mm512_set1_ps(nx);
    __m256 acc = _mm256_setzero_ps(), act = acc;
    for (l = 0; l + 16 <= L; l += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + l), mv));
        const __m512 f = exp16(_mm512_sub_ps(_mm512_loadu_ps(t + l), nv));
        _mm512_storeu_ps(s + l, e);
        _mm512_storeu_ps(t + l, f);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        act = _mm256_add_ps(act, _mm512_castps512_ps256(f));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
        act = _mm256_add_ps(act, _mm512_extractf32x8_ps(f, 1));
    }
    *ss = softmax_end(s, L, l, mx, acc);
    *st = softmax_end(t, L, l, nx, act);
}

/* KV head h's rows of the cache block holding positions [b0, b0 + bs) (block table bt): with
 * fp32 K/V the rows in place (stride nkv * d floats); with bf16 K/V (`kw`: bs * d floats) its
 * first n rows widened into kw (stride d). The same values either way, so the same results. */
static KT const float *block_rows(const void *cache, const int64_t *bt, int64_t b0, int64_t n, int64_t h,
                                  int64_t nkv, int64_t d, int64_t bs, float *kw, int64_t *stride) {
    const int64_t at = (bt[b0 / bs] * bs * nkv + h) * d;
    *stride = kw ? d : nkv * d;
    if (!kw) return (const float *)cache + at;
    widen_rows((const uint16_t *)cache + at, nkv * d, n, d, kw);
    return kw;
}

/* Prefetch (into L1) KV head h's rows of the cache block starting at position b0 (below L; esize:
 * bytes per element): the next block's rows, on their way while the current one is used. */
static KT inline void prefetch_rows(const void *cache, const int64_t *bt, int64_t b0, int64_t L, int64_t h,
                                    int64_t nkv, int64_t d, int64_t bs, int64_t esize) {
    if (b0 >= L) return;
    const int64_t n = (L < b0 + bs ? L : b0 + bs) - b0, row = nkv * d * esize;
    const char *p = (const char *)cache + (bt[b0 / bs] * bs * nkv + h) * d * esize;
    for (int64_t u = 0; u < n; u++)
        for (int64_t c = 0; c < d * esize; c += 64) _mm_prefetch(p + u * row + c, _MM_HINT_T0);
}

/* The lanes path (AVX-512, d = 64, G even and a divisor of 16): 16 (row, head) pairs of R = 16 / G
 * rows in the 16 lanes of a vector, r = i * G + g in lane r. qt holds their queries transposed
 * (qt[16 i + r] = q_r[i]); a key's 16 scores are one vector, s[16 l + r]. Lane r's score of key l is
 * the decode kernel's: acc_j = fma(K_l[j + 8k], q_r[j + 8k], acc_j) for k = 0..7 from 0 (j = 0..7, an
 * accumulator per 8-lane lane), then hsum8's tree ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) +
 * (acc3 + acc7)), times scale: the same operations on the same operands, no lane shuffled. */
/* Scores of NK (8 or 16) keys at k0 (rows of stride ks floats), the first nk of them stored at s; part: 8 * 16 * 16
 * floats (the 8 accumulators' partial sums). */
static KP inline void lanes_scores(const float *qt, const float *k0, int64_t ks, int NK, int64_t nk, float scale,
                                   float *s, float *part) {
    for (int j = 0; j < 8; j++) { /* accumulator j of every key: dimensions j, j + 8, .., j + 56 */
        __m512 qv[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) qv[k] = _mm512_loadu_ps(qt + 16 * (8 * k + j));
        __m512 a[16];
#pragma GCC unroll 16
        for (int u = 0; u < NK; u++) a[u] = _mm512_fmadd_ps(_mm512_set1_ps(k0[ks * u + j]), qv[0], _mm512_setzero_ps());
#pragma GCC unroll 8
        for (int k = 1; k < 8; k++)
#pragma GCC unroll 16
            for (int u = 0; u < NK; u++) a[u] = _mm512_fmadd_ps(_mm512_set1_ps(k0[ks * u + 8 * k + j]), qv[k], a[u]);
#pragma GCC unroll 16
        for (int u = 0; u < NK; u++) _mm512_storeu_ps(part + 16 * (16 * j + u), a[u]);
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int u = 0; u < nk; u++) {
        const float *p = part + 16 * u;
#define PJ(j) _mm512_loadu_ps(p + 256 * (j))
        _mm512_storeu_ps(s + 16 * u, _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(PJ(0), PJ(4)),
                                                                                _mm512_add_ps(PJ(2), PJ(6))),
                                                                 _mm512_add_ps(_mm512_add_ps(PJ(1), PJ(5)),
                                                                               _mm512_add_ps(PJ(3), PJ(7)))),
                                                   sv));
#undef PJ
    }
}

/* qt[16 i + r] = row r's q[i] (16 rows, d = 64): 16 x 16 transposes. */
static KP void lanes_pack(const float *const src[16], float *qt) {
    for (int c0 = 0; c0 < 64; c0 += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src[i] + c0);
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
            r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        }
        /* r[4b + m] quarter x: column 4x + m of rows 4b..4b+3 */
        for (int i = 0; i < 16; i += 8)
            for (int m = 0; m < 4; m++) {
                t[i + m] = _mm512_shuffle_f32x4(r[i + m], r[i + 4 + m], 0x88);
                t[i + 4 + m] = _mm512_shuffle_f32x4(r[i + m], r[i + 4 + m], 0xdd);
            }
        for (int m = 0; m < 8; m++) {
            _mm512_storeu_ps(qt + 16 * (c0 + m), _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88));
            _mm512_storeu_ps(qt + 16 * (c0 + 8 + m), _mm512_shuffle_f32x4(t[m], t[8 + m], 0xdd));
        }
    }
}

/* softmax_numerators of the 16 lanes' scores (lane r over its first len[r] keys) on key-major s:
 * the max over the lane's keys (exact in any order, NaN skipped as the scalar compare), each
 * numerator exp8's bits (exp16 is exp8 per lane), the sum as simd.h adds it: acc_t over keys
 * l = t (mod 8) below the lane's last multiple of 8, in order, then hsum8's tree, then the
 * remaining keys in order. Returns 1 / sum per lane. */
static KP inline __m512 lanes_softmax(float *s, int64_t L, __m512i len) {
    const __m512i len8 = _mm512_and_si512(len, _mm512_set1_epi32(~7));
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t l = 0; l < L; l++)
        m = _mm512_mask_max_ps(m, _mm512_cmpgt_epi32_mask(len, _mm512_set1_epi32((int)l)), _mm512_loadu_ps(s + 16 * l),
                               m);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) acc[t] = _mm512_setzero_ps();
    int64_t l = 0;
    for (; l + 8 <= L; l += 8)
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * (l + t)), m));
            _mm512_storeu_ps(s + 16 * (l + t), e);
            const __mmask16 k = _mm512_cmpgt_epi32_mask(len8, _mm512_set1_epi32((int)(l + t)));
            acc[t] = _mm512_mask_add_ps(acc[t], k, acc[t], e);
        }
    for (int64_t u = l; u < L; u++)
        _mm512_storeu_ps(s + 16 * u, exp16(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * u), m)));
    __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                               _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
    int low = _mm512_reduce_min_epi32(len8);
    for (int64_t u = low; u < L; u++) { /* keys in [len8, len) */
        const __mmask16 k = _mm512_cmpgt_epi32_mask(len, _mm512_set1_epi32((int)u)) &
                            _mm512_cmple_epi32_mask(len8, _mm512_set1_epi32((int)u));
        sum = _mm512_mask_add_ps(sum, k, sum, _mm512_loadu_ps(s + 16 * u));
    }
    return _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
}

/* Lanes r0 .. r0 + C - 1 (C <= 6) of the lanes path: o_r += p_rl V_l (o_r: 64 floats at oacc + 64 r, in
 * memory between blocks: exact) for the keys l in [l0, l1) of the block at vb (rows of stride vs, key
 * b0 first) that lane r sees (l < len[r]), in order: the decode kernel's FMAs, p_rl = s[16 l + r]. */
static KP inline void lanes_values(const float *s, const int32_t *len, int64_t r0, int C, const float *vb,
                                   int64_t vs, int64_t b0, int64_t l0, int64_t l1, float *oacc) {
    __m512 o[6][4];
    int64_t lmin = l1;
#pragma GCC unroll 6
    for (int c = 0; c < C; c++) {
        lmin = len[r0 + c] < lmin ? len[r0 + c] : lmin;
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++) o[c][x] = _mm512_loadu_ps(oacc + 64 * (r0 + c) + 16 * x);
    }
    int64_t l = l0;
    for (; l < lmin; l++) { /* keys every lane sees */
        const float *vp = vb + (l - b0) * vs;
        const __m512 v0 = _mm512_loadu_ps(vp), v1 = _mm512_loadu_ps(vp + 16), v2 = _mm512_loadu_ps(vp + 32),
                     v3 = _mm512_loadu_ps(vp + 48);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m512 p = _mm512_set1_ps(s[16 * l + r0 + c]);
            o[c][0] = _mm512_fmadd_ps(p, v0, o[c][0]);
            o[c][1] = _mm512_fmadd_ps(p, v1, o[c][1]);
            o[c][2] = _mm512_fmadd_ps(p, v2, o[c][2]);
            o[c][3] = _mm512_fmadd_ps(p, v3, o[c][3]);
        }
    }
    for (; l < l1; l++) { /* the causal diagonal: each lane its own keys */
        const float *vp = vb + (l - b0) * vs;
        const __m512 v0 = _mm512_loadu_ps(vp), v1 = _mm512_loadu_ps(vp + 16), v2 = _mm512_loadu_ps(vp + 32),
                     v3 = _mm512_loadu_ps(vp + 48);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            if (l >= len[r0 + c]) continue;
            const __m512 p = _mm512_set1_ps(s[16 * l + r0 + c]);
            o[c][0] = _mm512_fmadd_ps(p, v0, o[c][0]);
            o[c][1] = _mm512_fmadd_ps(p, v1, o[c][1]);
            o[c][2] = _mm512_fmadd_ps(p, v2, o[c][2]);
            o[c][3] = _mm512_fmadd_ps(p, v3, o[c][3]);
        }
    }
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++) _mm512_storeu_ps(oacc + 64 * (r0 + c) + 16 * x, o[c][x]);
}

/* R = 16 / G rows (entries e0..) of one tile and KV head h on the lanes path; scratch: s (16 lmax
 * floats), oacc (16 d), qt (16 d). Every lane's scores over the group's keys (those past a lane's
 * context computed, never used), its softmax over its own, its values over its own in order. */
static KP void lanes_rows(const float *q, const void *kc, const void *vc, float *out, const int64_t *tok,
                          const int64_t *bt, const int64_t *ctx_len, int64_t e0, int64_t h, int64_t G, int64_t nh,
                          int64_t nkv, int64_t bs, float scale, float *s, float *oacc, float *qt, float *kw) {
    const int64_t d = 64;
    float part[8 * 16 * 16] __attribute__((aligned(64))); /* lanes_scores' partial sums */
    float kbuf[16 * 64] __attribute__((aligned(64))); /* 16 key rows, contiguous */
    memset(kbuf, 0, sizeof kbuf);
    int64_t L = 0, stride;
    int32_t lens[16];
    const float *src[16];
    for (int64_t r = 0; r < 16; r++) {
        const int64_t c = ctx_len[e0 + r / G];
        lens[r] = (int32_t)c;
        L = c > L ? c : L;
        src[r] = q + (tok[e0 + r / G] * nh + h * G + r % G) * d;
    }
    lanes_pack(src, qt);
    const __m512i len = _mm512_loadu_si512(lens);
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* scores, block by block, every lane over the group's keys */
        const int64_t l1 = L < b0 + bs ? L : b0 + bs;
        const float *kb = block_rows(kc, bt, b0, l1 - b0, h, nkv, d, bs, kw, &stride);
        prefetch_rows(kc, bt, b0 + bs, L, h, nkv, d, bs, kw ? 2 : 4); /* the next block's, during this one */
        for (int64_t l = b0; l < l1; l += 16) {
            const int64_t nk = l1 - l < 16 ? l1 - l : 16;
            const float *k0 = kb + (l - b0) * stride;
            /* keys computed: nk rounded up to 8 or 16 (constants, so each case's loops unroll) */
#define LANES_SCORES(k, ks) (nk <= 8 ? lanes_scores(qt, k, ks, 8, nk, scale, s + 16 * l, part) \
                                     : lanes_scores(qt, k, ks, 16, nk, scale, s + 16 * l, part))
            if (l - b0 + (nk <= 8 ? 8 : 16) > bs) { /* rows past the block: its nk rows copied (the rest not read) */
                for (int64_t u = 0; u < nk; u++)
                    for (int64_t c = 0; c < d; c += 16)
                        _mm512_store_ps(kbuf + u * d + c, _mm512_loadu_ps(k0 + u * stride + c));
                LANES_SCORES(kbuf, 64);
            } else if (stride == 64) { /* constant strides: every operand at a constant offset */
                LANES_SCORES(k0, 64);
            } else if (stride == 128) {
                LANES_SCORES(k0, 128);
            } else if (stride == 256) {
                LANES_SCORES(k0, 256);
            } else {
                LANES_SCORES(k0, stride);
            }
#undef LANES_SCORES
        }
    }
    float inv[16];
    prefetch_rows(vc, bt, 0, L, h, nkv, d, bs, kw ? 2 : 4);
    _mm512_storeu_ps(inv, lanes_softmax(s, L, len));
    memset(oacc, 0, sizeof(float) * 16 * d);
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* values, block by block: lanes 0-5, 6-11, 12-15 */
        const int64_t l1 = L < b0 + bs ? L : b0 + bs;
        const float *vb = block_rows(vc, bt, b0, l1 - b0, h, nkv, d, bs, kw, &stride);
        prefetch_rows(vc, bt, b0 + bs, L, h, nkv, d, bs, kw ? 2 : 4);
        lanes_values(s, lens, 0, 6, vb, stride, b0, b0, l1, oacc);
        lanes_values(s, lens, 6, 6, vb, stride, b0, b0, l1, oacc);
        lanes_values(s, lens, 12, 4, vb, stride, b0, b0, l1, oacc);
    }
    for (int64_t r = 0; r < 16; r++) {
        float *o = out + (tok[e0 + r / G] * nh + h * G + r % G) * d;
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(oacc + r * d + c), _mm256_set1_ps(inv[r])));
    }
}

/* One tile (entries e0..e0+n-1, same block table row bt) and KV head h: G heads per row
 * (rows r = i * G + g). With `pairs` (AVX-512, d = 64), heads 2m and 2m + 1 of an entry run
 * together on 16-lane vectors (oacc then holds the pair interleaved by 8 floats). kw: NULL for
 * fp32 K/V; for bf16 K/V, bs * d floats where each block's rows are widened before use. */
#define KTW __attribute__((target("avx2,fma,prfchw"))) /* KT and prefetchw */
static KTW void tile_item(const float *q, const void *kc, const void *vc, float *out, const int64_t *tok,
                         const int64_t *bt, const int64_t *ctx_len, int64_t e0, int64_t n, int64_t h, int64_t G,
                         int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale, int64_t lmax, float *sc,
                         float *oacc, float *qp, int pairs, float *kw) {
    const int64_t rows = n * G, npair = pairs ? G / 2 : 0;
    int64_t stride;
    int64_t L = 0;
    for (int64_t i = 0; i < n; i++) L = ctx_len[e0 + i] > L ? ctx_len[e0 + i] : L;
    for (int64_t i = 0; i < n; i++) /* the output rows, written last: owned before then */
        for (int64_t g = 0; g < G; g++)
            for (int64_t c = 0; c < d; c += 16) __builtin_prefetch(out + (tok[e0 + i] * nh + h * G + g) * d + c, 1, 3);
    if (pairs && G % 2 == 0 && 16 % G == 0 && n % (16 / G) == 0) { /* whole groups of 16 / G rows */
        for (int64_t i = 0; i < n; i += 16 / G)
            lanes_rows(q, kc, vc, out, tok, bt, ctx_len, e0 + i, h, G, nh, nkv, bs, scale, sc, oacc, qp, kw);
        return;
    }
    for (int64_t i = 0; i < n; i++) /* packed query pairs */
        for (int64_t m = 0; m < npair; m++) {
            const float *qa = q + (tok[e0 + i] * nh + h * G + 2 * m) * d, *qb = qa + d;
            float *o = qp + (i * npair + m) * 2 * d;
            for (int64_t c = 0; c < d; c += 8) {
                memcpy(o + 2 * c, qa + c, 8 * sizeof(float));
                memcpy(o + 2 * c + 8, qb + c, 8 * sizeof(float));
            }
        }
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* scores, block by block */
        const float *kb = block_rows(kc, bt, b0, (L < b0 + bs ? L : b0 + bs) - b0, h, nkv, d, bs, kw, &stride);
        for (int64_t i = 0; i < n; i++) {
            const int64_t e = e0 + i, l1 = ctx_len[e] < b0 + bs ? ctx_len[e] : b0 + bs;
            if (l1 <= b0) continue;
            /* rows i and i + 1 (npair > 0): their common positions together, then each one's own */
            const int64_t l1n = i + 1 < n && npair ? (ctx_len[e + 1] < b0 + bs ? ctx_len[e + 1] : b0 + bs) : b0;
            const int64_t both = l1n < l1 ? l1n : l1;
            for (int64_t m = 0; m < npair; m++) {
                const int64_t r = i * G + 2 * m, rn = r + G;
                const float *qa = qp + (i * npair + m) * 2 * d, *qn = qa + npair * 2 * d;
                if (both > b0)
                    pair_scores2(qa, qn, kb, stride, b0, b0, both, d, scale, sc + r * lmax, sc + (r + 1) * lmax,
                                 sc + rn * lmax, sc + (rn + 1) * lmax);
                if (l1 > both)
                    pair_scores(qa, kb, stride, b0, both > b0 ? both : b0, l1, d, scale, sc + r * lmax,
                                sc + (r + 1) * lmax);
                if (both > b0 && l1n > both)
                    pair_scores(qn, kb, stride, b0, both, l1n, d, scale, sc + rn * lmax, sc + (rn + 1) * lmax);
            }
            for (int64_t g = 2 * npair; g < G; g++)
                block_scores(q + (tok[e] * nh + h * G + g) * d, kb, stride, b0, l1, d, scale, sc + (i * G + g) * lmax);
            if (both > b0) { /* row i + 1's pairs are done; its other heads here */
                for (int64_t g = 2 * npair; g < G; g++)
                    block_scores(q + (tok[e + 1] * nh + h * G + g) * d, kb, stride, b0, l1n, d, scale,
                                 sc + ((i + 1) * G + g) * lmax);
                i++;
            }
        }
    }
    float inv[QT * 16];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t Lr = ctx_len[e0 + r / G];
        if (!pairs) {
            inv[r] = 1.0f / softmax_numerators(sc + r * lmax, Lr);
        } else if (r % G < 2 * npair) { /* a head pair, rows r and r + 1 */
            float s0, s1;
            softmax_numerators16x2(sc + r * lmax, sc + (r + 1) * lmax, Lr, &s0, &s1);
            inv[r] = 1.0f / s0;
            inv[++r] = 1.0f / s1;
        } else {
            inv[r] = 1.0f / softmax_numerators16(sc + r * lmax, Lr);
        }
    }
    memset(oacc, 0, sizeof(float) * rows * d);
    for (int64_t b0 = 0; b0 < L; b0 += bs) { /* values, block by block */
        const float *vb = block_rows(vc, bt, b0, (L < b0 + bs ? L : b0 + bs) - b0, h, nkv, d, bs, kw, &stride);
        for (int64_t i = 0; i < n; i++) {
            const int64_t e = e0 + i, l1 = ctx_len[e] < b0 + bs ? ctx_len[e] : b0 + bs;
            if (l1 <= b0) continue;
            /* as the scores: rows i and i + 1 over their common positions, then each one's own
             * (each row's positions still in order) */
            const int64_t l1n = i + 1 < n && npair ? (ctx_len[e + 1] < b0 + bs ? ctx_len[e + 1] : b0 + bs) : b0;
            const int64_t both = l1n < l1 ? l1n : l1;
            for (int64_t m = 0; m < npair; m++) {
                const int64_t r = i * G + 2 * m, rn = r + G;
                if (both > b0)
                    pair_values64x2(sc + r * lmax, sc + (r + 1) * lmax, sc + rn * lmax, sc + (rn + 1) * lmax, vb,
                                    stride, b0, b0, both, oacc + r * d, oacc + rn * d);
                if (l1 > both)
                    pair_values64(sc + r * lmax, sc + (r + 1) * lmax, vb, stride, b0, both > b0 ? both : b0, l1,
                                  oacc + r * d);
                if (both > b0 && l1n > both)
                    pair_values64(sc + rn * lmax, sc + (rn + 1) * lmax, vb, stride, b0, both, l1n, oacc + rn * d);
            }
            for (int64_t g = 2 * npair; g < G; g++)
                block_values(sc + (i * G + g) * lmax, vb, stride, b0, l1, d, oacc + (i * G + g) * d);
            if (both > b0) {
                for (int64_t g = 2 * npair; g < G; g++)
                    block_values(sc + ((i + 1) * G + g) * lmax, vb, stride, b0, l1n, d, oacc + ((i + 1) * G + g) * d);
                i++;
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t e = e0 + r / G, g = r % G, j = h * G + g;
        float *o = out + (tok[e] * nh + j) * d;
        const float *a = oacc + r * d;
        if (g < 2 * npair) { /* de-interleave the pair: head 2m from the low 8 of each 16 */
            a = oacc + (r - g % 2) * d + (g % 2) * 8;
            for (int64_t c = 0; c < d; c += 8)
                _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(a + 2 * c), _mm256_set1_ps(inv[r])));
            continue;
        }
        const __m256 iv = _mm256_set1_ps(inv[r]);
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), iv));
        for (; c < d; c++) o[c] = a[c] * inv[r];
    }
}

/* Decode attention (es_decode_attention_f32's inputs and bits) for work items [i0, i1) on the
 * calling thread, item = b * nkv + h: entry b's G query heads of KV head h, a tile of one row, so
 * each K and V row is read once for the G heads. lmax: the largest ctx_len of the call. For
 * callers inside a parallel region (decode_layer.c) and es_decode_attention_f32. G <= 16.
 * Returns 0, or 2 when out of memory. */
KT int es_decode_attention_kv(const float *q, const void *kc, const void *vc, int kv_bf16, float *out,
                              const int64_t *tok, const int64_t *block_table, const int64_t *ctx_len, int64_t max_blocks,
                              int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale, int64_t lmax, int64_t i0,
                              int64_t i1) {
    const int64_t G = nh / nkv;
    const int pairs = d == 64 && G >= 2 && es_gemm_packed_available(); /* AVX-512 */
    const size_t bytes[4] = {sizeof(float) * (size_t)(G * lmax), sizeof(float) * (size_t)(G * d),
                             sizeof(float) * (size_t)(G * d) + 64, kv_bf16 ? sizeof(float) * (size_t)(bs * d) : 0};
    void *pt[4];
    if (es_scratch_parts(ES_SCRATCH_ATTENTION, 4, bytes, pt)) return 2;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t b = item / nkv, h = item % nkv;
        tile_item(q, kc, vc, out, tok, block_table + b * max_blocks, ctx_len, b, 1, h, G, nh, nkv, d, bs, scale, lmax,
                  pt[0], pt[1], pt[2], pairs, kv_bf16 ? pt[3] : NULL);
    }
    return 0;
}

/* Returns 0, or 2 when out of memory (then nothing is guaranteed written). Heads per KV head
 * G = nh / nkv must be at most 16. */
KT int es_prefill_attention_f32(const float *q, const void *kc, const void *vc, int kv_bf16, float *out,
                                const int64_t *tok, const int64_t *block_table, const int64_t *ctx_len, int64_t B,
                                int64_t max_blocks, int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale) {
    const int64_t G = nh / nkv;
    const int pairs = d == 64 && G >= 2 && es_gemm_packed_available(); /* AVX-512 */
    int64_t lmax = 1, n_tiles = 0;
    for (int64_t b = 0; b < B; b++) lmax = ctx_len[b] > lmax ? ctx_len[b] : lmax;
    const int max_nt = omp_get_max_threads();
    const size_t parts_bytes[2] = {sizeof(int64_t) * (size_t)(B + 1), sizeof(int64_t) * (size_t)(CURSOR * max_nt)};
    void *parts[2];
    if (es_scratch_parts(ES_SCRATCH_PACKED, 2, parts_bytes, parts)) return 2;
    int64_t *tile_start = parts[0], *cursor = parts[1];
    for (int64_t b = 0; b < B; b++) { /* a new tile at a new table row or after QT rows */
        const int64_t *row = block_table + b * max_blocks;
        if (b == 0 || b - tile_start[n_tiles - 1] >= QT || memcmp(row, row - max_blocks, sizeof(int64_t) * max_blocks))
            tile_start[n_tiles++] = b;
    }
    tile_start[n_tiles] = B;
    int oom = 0;
#pragma omp parallel if (B * nh * lmax * d >= PARALLEL_MIN_MACS)
    {
        const size_t bytes[4] = {sizeof(float) * (size_t)(QT * G * lmax), sizeof(float) * (size_t)(QT * G * d),
                                 sizeof(float) * (size_t)(QT * G * d) + 64,
                                 kv_bf16 ? sizeof(float) * (size_t)(bs * d) : 0};
        void *pt[4] = {NULL, NULL, NULL, NULL};
        if (es_scratch_parts(ES_SCRATCH_ATTENTION, 4, bytes, pt)) {
#pragma omp atomic write
            oom = 1;
        }
        float *sc = pt[0], *oacc = pt[1], *qp = pt[2];
        /* Thread j first takes the items of its own share [j n / nt, (j + 1) n / nt) in order (item =
         * tile * nkv + head, tiles in row order: the rows the kernels before wrote on this thread,
         * whose static splits are by rows), then helps the others with theirs, each share's next
         * item taken by an atomic step of that share's cursor. */
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t n_items = n_tiles * nkv;
        cursor[CURSOR * tid] = n_items * tid / nt;
#pragma omp barrier
        for (int k = 0; k < nt; k++) {
            const int j = (tid + k) % nt;
            const int64_t end = n_items * (j + 1) / nt;
            for (;;) {
                int64_t item;
#pragma omp atomic capture
                item = cursor[CURSOR * j]++;
                if (item >= end) break;
                if (!sc || !oacc || !qp) continue;
                const int64_t t = item / nkv, h = item % nkv, e0 = tile_start[t];
                if (item + 1 < end) { /* the next item's query rows, on their way during this one */
                    const int64_t t1 = (item + 1) / nkv, h1 = (item + 1) % nkv;
                    for (int64_t e = tile_start[t1]; e < tile_start[t1 + 1]; e++)
                        for (int64_t c = 0; c < G * d; c += 16)
                            __builtin_prefetch(q + (tok[e] * nh + h1 * G) * d + c, 0, 2);
                }
                tile_item(q, kc, vc, out, tok, block_table + e0 * max_blocks, ctx_len, e0, tile_start[t + 1] - e0,
                          h, G, nh, nkv, d, bs, scale, lmax, sc, oacc, qp, pairs, kv_bf16 ? pt[3] : NULL);
            }
        }
    }
    return oom ? 2 : 0;
}
