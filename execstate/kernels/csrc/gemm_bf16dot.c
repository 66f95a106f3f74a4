/* bf16 arithmetic (AVX512-BF16): y = bf16(x) @ w^T with bf16 weights, products by vdpbf16ps,
 * fp32 sums, one fixed order for every row count (the numerics of the bf16 mode; contracts in
 * module.c, the order below).
 *
 * The dot product of one x row and one weight row (K columns), "bf16 dot order":
 *   1. x is rounded to bf16, round-to-nearest-even per element (vcvtne2ps2bf16: subnormals to
 *      zero); K is padded with zeros to a multiple of 32;
 *   2. 16 fp32 lanes, zero at first; chunk c (columns 32c .. 32c + 31) in order:
 *      acc = vdpbf16ps(acc, x chunk, w chunk), i.e. lane j adds x[2j+1] w[2j+1], then x[2j] w[2j]
 *      (each product exact, each add rounded to nearest even; subnormal results flushed);
 *   3. the lanes summed by the tree (i + i+8), (i + i+4), (i + i+2), (0 + 1): hsum16.
 * Every kernel below (few rows, many rows, any tile) computes exactly this per output, so a
 * row's result does not depend on M, the other rows, the thread count or the path (decode,
 * prefill, MoE): batch invariance. gemm_bf16dot_emu.c computes the same order with fp32 FMAs
 * for CPUs without AVX512-BF16 (equal bits but for subnormals: its own numerics id).
 *
 * Blocking: a thread owns weight rows [n0, n1); x rows are converted once per call into this
 * thread's scratch (ES_SCRATCH_ROWS), MB rows at a time kept in L2 while every owned weight
 * row passes over them in tiles of P rows x J weight rows (P * J accumulators), so weights
 * stream from memory once per MB rows (decode: once). The horizontal sums of a full 4 x 4
 * tile are one transposition (hsum16_x16, the same tree). */
#include "kernels.h"
#include "simd.h"
#include "simd512.h"
#include "bf16dot_tile.h"

#define MB 128 /* x rows per L2 block */
#define MOE_FUSED_MIN_SLOTS 64 /* fewer slots: es_moe_with (its per-call work is smaller) */

int es_bf16dot_available(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = es_gemm_packed_available() && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512bf16");
    }
    return ok;
}

/* The rows kernel (es_rows_fn): yr[m][n] = dot(bf16(xr[m]), w[n]) in bf16 dot order, m < M,
 * n in [n0, n1). If this thread's conversion buffer cannot be had, rows are converted one
 * block of 4 at a time into a buffer on the stack where K allows, else... see below. */
KB void es_linear_rows_bf16dot(const float *const *xr, float *const *yr, int64_t M, const void *wv, int64_t K,
                               int64_t n0, int64_t n1) {
    const uint16_t *w = (const uint16_t *)wv;
    const int64_t kp = (K + 31) & ~(int64_t)31;
    if (M <= 0 || n1 <= n0) return;
    const int64_t mb = M < MB ? M : MB;
    uint16_t *xb = es_scratch(ES_SCRATCH_ROWS, sizeof(uint16_t) * (size_t)(mb * kp));
    const int64_t step = xb ? mb : 1;
    uint16_t one[xb ? 1 : kp]; /* no scratch: one row at a time on the stack (same bits) */
    if (!xb) xb = one;
    for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t m1 = m0 + step < M ? m0 + step : M;
        round_rows(xr + m0, xb, m1 - m0, K, kp);
        block_rows(xb, kp, yr, m0, m1, w, K, n0, n1, m0 == 0);
    }
}

/* Many rows (prefill): the team rounds x once, each thread a share of the rows, into the calling
 * thread's ES_SCRATCH_SHARED_ROWS buffer, then every thread multiplies all of them against its
 * weight rows, MB rows at a time; or, with N <= M (w no larger than the rounded x: the prefill's
 * q/k/v and o-proj), each thread multiplies its own rows against all weight rows, no barrier,
 * writing whole rows of y (the rows the row-split kernels around it handle on the same core).
 * es_linear_rows_bf16dot has every thread round every row for its own weight rows (the same
 * rounding done nt times); each output is the same dot product either way, so the same bits.
 * Few rows, or no buffer: es_linear_with. */
KB int es_linear_bf16dot(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N) {
    const int64_t kp = (K + 31) & ~(int64_t)31;
    uint16_t *xb = NULL;
    float **yr = NULL;
    if (M >= MB && M * K * N >= PARALLEL_MIN_MACS) {
        xb = es_scratch(ES_SCRATCH_SHARED_ROWS, sizeof(uint16_t) * (size_t)(M * kp));
        yr = xb ? malloc(sizeof(float *) * (size_t)M) : NULL;
    }
    if (!yr) return es_linear_with(es_linear_rows_bf16dot, x, w, y, M, K, N);
    for (int64_t m = 0; m < M; m++) yr[m] = y + m * N;
    const int by_rows = N <= M; /* w no larger than the rounded x: each thread reads all of w */
#pragma omp parallel
    {
        int64_t lo, hi;
        share(M, &lo, &hi);
        for (int64_t m = lo; m < hi; m++) {
            const float *xm = x + m * K;
            round_rows(&xm, xb + m * kp, 1, K, kp);
        }
        if (by_rows) { /* its own rows against every weight row: no barrier */
            for (int64_t m0 = lo; m0 < hi; m0 += MB) {
                const int64_t m1 = m0 + MB < hi ? m0 + MB : hi;
                block_rows(xb + m0 * kp, kp, (float *const *)yr, m0, m1, w, K, 0, N, m0 == lo);
            }
        } else {
#pragma omp barrier
            share(N, &lo, &hi);
            if (lo < hi)
                for (int64_t m0 = 0; m0 < M; m0 += MB) {
                    const int64_t m1 = m0 + MB < M ? m0 + MB : M;
                    block_rows(xb + m0 * kp, kp, (float *const *)yr, m0, m1, w, K, lo, hi, m0 == 0);
                }
        }
    }
    free(yr);
    return 0;
}

/* es_linear_qkv_bf16dot / es_linear_add_norm_bf16dot (kernels.h): es_linear_bf16dot's split by
 * rows for any shape, each thread's rows EPI_MB at a time rounded into its ES_SCRATCH_ROWS buffer
 * and multiplied into its scratch block (block_rows: the bf16 dot order, so the same bits), then
 * the epilogue on them while the block is in L2; no y. The first block prefetches the weights,
 * as es_linear_bf16dot (on every block: 0.2-0.3 ms slower a call; blocks of 32-128 rows within
 * noise of each other; the standard MoE's q/k/v, 2,048 rows, one thread). */
#define EPI_MB 64

static KB int linear_epilogue(const float *x, const uint16_t *w, int64_t M, int64_t K, int64_t N, es_epilogue_fn epi,
                              const void *e) {
    if (!es_bf16dot_available()) return 3;
    if (M <= 0) return 0;
    const int64_t kp = (K + 31) & ~(int64_t)31;
    int oom = 0;
#pragma omp parallel if (M * K * N >= PARALLEL_MIN_MACS)
    {
        int64_t lo, hi;
        share(M, &lo, &hi);
        uint16_t *xb = NULL;
        float *yb = NULL;
        if (lo < hi) {
            xb = es_scratch(ES_SCRATCH_ROWS, sizeof(uint16_t) * (size_t)(EPI_MB * kp));
            yb = es_scratch(ES_SCRATCH_EPILOGUE, sizeof(float) * (size_t)(EPI_MB * N));
            if (!xb || !yb) {
#pragma omp atomic write
                oom = 1;
            }
        }
#pragma omp barrier
        float *yr[EPI_MB];
        for (int64_t m = 0; m < EPI_MB && yb; m++) yr[m] = yb + m * N;
        for (int64_t m0 = lo; m0 < hi && !oom; m0 += EPI_MB) {
            const int64_t n = hi - m0 < EPI_MB ? hi - m0 : EPI_MB;
            const float *xm[EPI_MB];
            for (int64_t m = 0; m < n; m++) xm[m] = x + (m0 + m) * K;
            round_rows(xm, xb, n, K, kp);
            block_rows(xb, kp, (float *const *)yr, 0, n, w, K, 0, N, m0 == lo);
            epi(e, yb, m0, n);
        }
    }
    return oom ? 2 : 0;
}

KB int es_linear_qkv_bf16dot(const float *x, const uint16_t *w, int64_t M, int64_t K, const EsQkvRope *e) {
    return linear_epilogue(x, w, M, K, (e->nh + 2 * e->nkv) * e->d, es_qkv_epilogue, e);
}

KB int es_linear_add_norm_bf16dot(const float *a, const uint16_t *w, int64_t M, int64_t K, const EsAddNorm *e) {
    return linear_epilogue(a, w, M, K, e->H, es_add_norm_epilogue, e);
}

KB int es_moe_bf16dot(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                      float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    if (T * k >= MOE_FUSED_MIN_SLOTS && es_moe_bf16dot_fused_applies(H, I, k)) /* the same bits */
        return es_moe_bf16dot_fused(x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
    return es_moe_with(es_linear_rows_bf16dot, 32 * sizeof(uint16_t), x, ids, wts, w_gu, w_d, out, T, k, E, H, I);
}
