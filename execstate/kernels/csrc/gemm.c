/* Small-batch fp32 linear and the fused MoE expert block: every weight row streamed once for
 * all rows that use it (see module.c for the contracts). */
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* 4 x rows by 2 weight rows (w0 = row n, w1 = row n + 1): 6 loads per 8 FMAs. */
static KT inline void dot_4x2(const float *const *xr, float *const *yr, const float *w0, const float *w1,
                              int64_t n, int64_t k8, int64_t K) {
    const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *p0 = w0 + PF_ROWS * K, *p1 = w1 + PF_ROWS * K;
    for (int64_t k = 0; k < k8; k += 8) {
        PF(p0 + k); PF(p1 + k);
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        __m256 u = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(v0, u, a0); b0 = _mm256_fmadd_ps(v1, u, b0);
        u = _mm256_loadu_ps(x1 + k);
        a1 = _mm256_fmadd_ps(v0, u, a1); b1 = _mm256_fmadd_ps(v1, u, b1);
        u = _mm256_loadu_ps(x2 + k);
        a2 = _mm256_fmadd_ps(v0, u, a2); b2 = _mm256_fmadd_ps(v1, u, b2);
        u = _mm256_loadu_ps(x3 + k);
        a3 = _mm256_fmadd_ps(v0, u, a3); b3 = _mm256_fmadd_ps(v1, u, b3);
    }
    yr[0][n] = finish(a0, w0, x0, k8, K); yr[0][n + 1] = finish(b0, w1, x0, k8, K);
    yr[1][n] = finish(a1, w0, x1, k8, K); yr[1][n + 1] = finish(b1, w1, x1, k8, K);
    yr[2][n] = finish(a2, w0, x2, k8, K); yr[2][n + 1] = finish(b2, w1, x2, k8, K);
    yr[3][n] = finish(a3, w0, x3, k8, K); yr[3][n + 1] = finish(b3, w1, x3, k8, K);
}

/* 1 x row by 8 weight rows (w0 = row n): the batch-1 decode shape. Eight rows in flight and
 * no software prefetch stream closer to a plain sequential read (2 Zen 5 cores, a 32000 x 512
 * weight, A/B in one process: +9-12% over 4 rows + prefetch; batch-1 decode of the standard
 * model +4-6%, same tokens). The bf16 kernel's rows are half as long; there the same change
 * lost 6% end to end, so it keeps 4 rows and its prefetch. */
static KT inline void dot_1x8(const float *xa, float *ya, const float *w0, int64_t n, int64_t k8, int64_t K) {
    __m256 a[8];
    for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < k8; k += 8) {
        const __m256 va = _mm256_loadu_ps(xa + k);
        for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + r * K + k), va, a[r]);
    }
    for (int r = 0; r < 8; r++) ya[n + r] = finish(a[r], w0 + r * K, xa, k8, K);
}

/* yr[m][n] = dot(xr[m], w + n*K) for m < M, n in [n0, n1). Weight rows are taken 4 at a
 * time (read from memory once, reused from L1 by every group of x rows); 8 for one x row. */
static KT void dot_rows(const float *const *xr, float *const *yr, int64_t M, const float *w, int64_t K,
                        int64_t n0, int64_t n1) {
    const int64_t k8 = K & ~(int64_t)7;
    int64_t n = n0;
    if (M == 1)
        for (; n + 8 <= n1; n += 8) dot_1x8(xr[0], yr[0], w + n * K, n, k8, K);
    for (; n + 4 <= n1; n += 4) {
        const float *w0 = w + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            dot_4x2(xr + m, yr + m, w0, w1, n, k8, K);
            dot_4x2(xr + m, yr + m, w2, w3, n + 2, k8, K);
        }
        for (; m + 2 <= M; m += 2) {
            const float *xa = xr[m], *xb = xr[m + 1];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int64_t k = 0; k < k8; k += 8) {
                PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
                __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
                __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
                __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
                a0 = _mm256_fmadd_ps(v0, va, a0); b0 = _mm256_fmadd_ps(v0, vb, b0);
                a1 = _mm256_fmadd_ps(v1, va, a1); b1 = _mm256_fmadd_ps(v1, vb, b1);
                a2 = _mm256_fmadd_ps(v2, va, a2); b2 = _mm256_fmadd_ps(v2, vb, b2);
                a3 = _mm256_fmadd_ps(v3, va, a3); b3 = _mm256_fmadd_ps(v3, vb, b3);
            }
            float *ya = yr[m], *yb = yr[m + 1];
            ya[n] = finish(a0, w0, xa, k8, K); yb[n] = finish(b0, w0, xb, k8, K);
            ya[n + 1] = finish(a1, w1, xa, k8, K); yb[n + 1] = finish(b1, w1, xb, k8, K);
            ya[n + 2] = finish(a2, w2, xa, k8, K); yb[n + 2] = finish(b2, w2, xb, k8, K);
            ya[n + 3] = finish(a3, w3, xa, k8, K); yb[n + 3] = finish(b3, w3, xb, k8, K);
        }
        if (m < M) {
            const float *xa = xr[m];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < k8; k += 8) {
                PF(w0 + PF_ROWS * K + k); PF(w1 + PF_ROWS * K + k); PF(w2 + PF_ROWS * K + k); PF(w3 + PF_ROWS * K + k);
                __m256 va = _mm256_loadu_ps(xa + k);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), va, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), va, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), va, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), va, a3);
            }
            float *ya = yr[m];
            ya[n] = finish(a0, w0, xa, k8, K);
            ya[n + 1] = finish(a1, w1, xa, k8, K);
            ya[n + 2] = finish(a2, w2, xa, k8, K);
            ya[n + 3] = finish(a3, w3, xa, k8, K);
        }
    }
    for (; n < n1; n++) {
        const float *w0 = w + n * K;
        for (int64_t m = 0; m < M; m++) {
            const float *xa = xr[m];
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t k = 0; k < k8; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(xa + k), a0);
            yr[m][n] = finish(a0, w0, xa, k8, K);
        }
    }
}


static KT void rows_f32(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                        int64_t n1) {
    dot_rows(xr, yr, M, (const float *)w, K, n0, n1);
}

/* y = x @ w^T with `rows` computing weight rows [n0, n1) for every x row (one weight format's
 * dot products); the columns are shared over the OpenMP team. Returns 0, or 2 when out of
 * memory (nothing computed). */
KT int es_linear_with(es_rows_fn rows, const float *x, const void *w, float *y, int64_t M, int64_t K, int64_t N) {
    const float **xr = malloc(sizeof(float *) * (M + 1));
    float **yr = malloc(sizeof(float *) * (M + 1));
    if (!xr || !yr) {
        free(xr);
        free(yr);
        return 2;
    }
    for (int64_t m = 0; m < M; m++) { xr[m] = x + m * K; yr[m] = y + m * N; }
    if (M * K * N < PARALLEL_MIN_MACS) { /* serial: no OpenMP team setup at all */
        rows(xr, yr, M, w, K, 0, N);
    } else {
#pragma omp parallel
        {
            int64_t lo, hi;
            share(N, &lo, &hi);
            rows(xr, yr, M, w, K, lo, hi);
        }
    }
    free(xr);
    free(yr);
    return 0;
}

/* Returns 0, or 2 when out of memory (nothing computed). */
KT int es_linear_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
    return es_linear_with(rows_f32, x, w, y, M, K, N);
}

/* Rows [lo, hi) of the concatenation over active experts of `rows` rows each, as `fn` calls on
 * each expert's weight (stride `estride` elements, `bytes32` bytes per 32 of them) and its slot
 * rows. */
static KT void expert_rows(es_rows_fn fn, size_t bytes32, int64_t lo, int64_t hi, int64_t rows, const int64_t *active,
                           int64_t n_active, const int64_t *offset, const int64_t *count, const float *const *in,
                           float *const *out, const void *w, int64_t estride, int64_t K) {
    for (int64_t a = lo / rows; a < n_active && a * rows < hi; a++) {
        int64_t r0 = a * rows > lo ? 0 : lo - a * rows;
        int64_t r1 = (a + 1) * rows < hi ? rows : hi - a * rows;
        int64_t e = active[a];
        fn(in + offset[e], out + offset[e], count[e], (const char *)w + e * estride * (int64_t)bytes32 / 32, K, r0, r1);
    }
}

/* Row `w`'s place in the concatenation over active experts of `rows` rows each, counted in work:
 * expert a's rows weigh count[active[a]] each (its slot rows). Returns the row where work w
 * falls, rounded to a multiple of 12 rows within its expert (whole tiles of the row kernels).
 * Monotone in w, 0 at 0 and n_active * rows at the total. */
static int64_t row_at_work(int64_t w, int64_t rows, const int64_t *active, int64_t n_active, const int64_t *count) {
    for (int64_t a = 0; a < n_active; a++) {
        const int64_t c = count[active[a]];
        if (w < c * rows) {
            int64_t r = (w / c + 6) / 12 * 12;
            return a * rows + (r < rows ? r : rows);
        }
        w -= c * rows;
    }
    return n_active * rows;
}

/* This thread's rows [*lo, *hi) of the concatenation above, split by work rather than by rows:
 * routing gives experts unequal slot counts (measured on the standard model's prefill: the
 * busier half of the experts had 1.0-1.3x the mean), so an even split of rows left one thread
 * waiting at the barrier. Which thread computes an output does not change it. */
static void share_work(int64_t rows, const int64_t *active, int64_t n_active, const int64_t *count, int64_t *lo,
                       int64_t *hi) {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int64_t total = 0;
    for (int64_t a = 0; a < n_active; a++) total += count[active[a]] * rows;
    *lo = row_at_work(total * tid / nt, rows, active, n_active, count);
    *hi = tid + 1 == nt ? n_active * rows : row_at_work(total * (tid + 1) / nt, rows, active, n_active, count);
}

/* Every MoE driver's layout: the slots grouped by expert, token order within. count[e] slots of
 * expert e sit at positions offset[e] .. offset[e] + count[e]; pos[s] = slot s's position (ids
 * already checked to be in [0, E)). fill: E int64s of scratch. */
void es_moe_group(const int64_t *ids, int64_t S, int64_t E, int64_t *count, int64_t *offset, int64_t *fill,
                  int64_t *pos) {
    memset(count, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t s = 0; s < S; s++) count[ids[s]]++;
    for (int64_t e = 0, acc = 0; e < E; e++) {
        offset[e] = fill[e] = acc;
        acc += count[e];
    }
    for (int64_t s = 0; s < S; s++) pos[s] = fill[ids[s]]++;
}

/* The fused MoEs' combine as the down product's epilogue (k <= 2 slots a token): per position p,
 * its token tok[p], its weight slot_w[p] and whether it is its token's first slot. A thread
 * visits a column's slot rows in position order (experts in order, rows in order), so a token's
 * first slot is its lower position. */
void es_moe_combine_order(const int64_t *pos, const float *wts, int64_t S, int64_t k, int64_t *tok, float *slot_w,
                          unsigned char *first) {
    for (int64_t s = 0; s < S; s++) {
        const int64_t p = pos[s], t = s / k;
        tok[p] = t;
        slot_w[p] = wts[s];
        first[p] = k == 1 || p < pos[t * k + (s % k == 0)];
    }
}

/* The fused MoE block with `rows` as the dot products of weights stored in `bytes32` bytes per 32
 * elements (fp32 128, bf16 64, GGUF blocks their block size; an expert's matrix holds a multiple
 * of 32 elements).
 * Temporaries: this thread's ES_SCRATCH_MOE buffer (scratch.c).
 * Returns 0, 1 if an id is out of range or 2 when out of memory (nothing computed then). */
KT int es_moe_with(es_rows_fn rows, size_t bytes32, const float *x, const int64_t *ids, const float *wts,
                   const void *w_gu, const void *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H,
                   int64_t I) {
    const int64_t S = T * k;
    for (int64_t s = 0; s < S; s++)
        if (ids[s] < 0 || ids[s] >= E) return 1;
    const size_t n64 = sizeof(int64_t) * (size_t)E, fsz = sizeof(float), psz = sizeof(float *) * (size_t)S;
    const size_t bytes[12] = {n64, n64, n64, sizeof(int64_t) * (size_t)S, n64, fsz * (size_t)(S * 2 * I),
                              fsz * (size_t)(S * I), fsz * (size_t)(S * H), psz, psz, psz, psz};
    void *pt[12];
    if (es_scratch_parts(ES_SCRATCH_MOE, 12, bytes, pt)) return 2;
    int64_t *count = pt[0], *offset = pt[1], *active = pt[2], *pos = pt[3], *fill = pt[4];
    float *gu = pt[5], *h = pt[6], *y = pt[7];
    const float **xin = pt[8], **hin = pt[9];
    float **guo = pt[10], **yo = pt[11];
    int64_t n_active = 0;
    es_moe_group(ids, S, E, count, offset, fill, pos);
    for (int64_t e = 0; e < E; e++)
        if (count[e]) active[n_active++] = e;
    for (int64_t s = 0; s < S; s++) xin[pos[s]] = x + (s / k) * H;
    for (int64_t p = 0; p < S; p++) {
        guo[p] = gu + p * 2 * I;
        hin[p] = h + p * I;
        yo[p] = y + p * H;
    }
#pragma omp parallel if (S * H * I >= PARALLEL_MIN_MACS)
    {
        int64_t lo, hi;
        share_work(2 * I, active, n_active, count, &lo, &hi);
        expert_rows(rows, bytes32, lo, hi, 2 * I, active, n_active, offset, count, xin, guo, w_gu, 2 * I * H, H);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t p = 0; p < S; p++) es_silu_mul(gu + p * 2 * I, gu + p * 2 * I + I, h + p * I, I);
        share_work(H, active, n_active, count, &lo, &hi);
        expert_rows(rows, bytes32, lo, hi, H, active, n_active, offset, count, hin, yo, w_d, H * I, I);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float *o = out + t * H;
            for (int64_t n = 0; n < H; n++) {
                float s = wts[t * k] * y[pos[t * k] * H + n];
                for (int64_t j = 1; j < k; j++) s += wts[t * k + j] * y[pos[t * k + j] * H + n];
                o[n] = s;
            }
        }
    }
    return 0;
}

KT int es_moe_f32(const float *x, const int64_t *ids, const float *wts, const float *w_gu, const float *w_d,
                  float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    return es_moe_with(rows_f32, 32 * sizeof(float), x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
}

/* Weight rows [n0, n1) of y = x @ w^T on the calling thread (xr/yr: row pointers), for
 * callers that are already inside a parallel region (decode_layer.c); the same dot products
 * as es_linear_f32, so the same results. */
KT void es_linear_rows_f32(const float *const *xr, float *const *yr, int64_t M, const float *w, int64_t K, int64_t n0,
                           int64_t n1) {
    dot_rows(xr, yr, M, w, K, n0, n1);
}
