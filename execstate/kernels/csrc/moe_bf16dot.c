/* The fused MoE block in bf16 arithmetic for many tokens: es_moe_bf16dot's contract and, bit for
 * bit, its results (es_moe_with over es_linear_rows_bf16dot: every product the bf16 dot order
 * of gemm_bf16dot.c, the SwiGLU es_silu_mul, the combine w0 y0 + w1 y1), without the unfused
 * path's passes through memory:
 *   - each slot row of x is rounded to bf16 once for the team (the unfused path rounds an
 *     expert's rows once per thread and per call);
 *   - the gate/up product of MB slot rows and NH columns goes to a buffer in L2 (this thread's)
 *     and the SwiGLU is its epilogue: h goes to memory once, already rounded to bf16 as the
 *     down product's rows (round_rows's conversion, elementwise, so the same bits as rounding
 *     whole rows later);
 *   - the down product of MB rows likewise, with the weighted combine as its epilogue (out[t] =
 *     w * y, or += for a token's second slot: an IEEE product and a sum of two do not depend on
 *     the operands' order).
 * Both products are block_rows (bf16dot_tile.h), the linears' own loops.
 * Work split: the threads share the slot rows' rounding, then h's columns (multiples of 32), then
 * out's columns; each output is computed by one thread in the same order whichever it is.
 * Applies (es_moe_bf16dot_fused_applies) with H and I multiples of 32 and at most 2 slots a
 * token. Returns 0, 1 if an id is out of range, 2 when out of memory. */
#include "bf16dot_tile.h"

#define NH 96 /* h columns per block: their gate and up rows (2 NH x H bf16) stay in L2 */
#define MB 128 /* slot rows per block of the down product (MB x I bf16 kept in L2) */

int es_moe_bf16dot_fused_applies(int64_t H, int64_t I, int64_t k) {
    return es_bf16dot_available() && H % 32 == 0 && I % 32 == 0 && k >= 1 && k <= 2;
}

/* h columns [c0, c1) of one expert's M slot rows (rounded x at xb, stride H; wgu: its gate rows,
 * then its I up rows), as bf16 into hb (stride I). MB rows at a time: the gate and up products
 * of NH columns into buf (this thread's, MB x 2 NH floats; yr: MB row pointers), then the
 * SwiGLU and the rounding row by row. */
static KB void gate_up_block(const uint16_t *xb, const uint16_t *wgu, uint16_t *hb, int64_t M, int64_t H, int64_t I,
                             int64_t c0, int64_t c1, float *buf, float **yr) {
    float h[NH] __attribute__((aligned(64)));
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const int64_t rows = M - m0 < MB ? M - m0 : MB;
        for (int64_t cb = c0; cb < c1; cb += NH) {
            const int64_t nc = c1 - cb < NH ? c1 - cb : NH;
            for (int64_t r = 0; r < rows; r++) yr[r] = buf + r * 2 * NH;
            block_rows(xb + m0 * H, H, yr, 0, rows, wgu + cb * H, H, 0, nc, m0 == 0); /* gate */
            for (int64_t r = 0; r < rows; r++) yr[r] = buf + r * 2 * NH + nc;
            block_rows(xb + m0 * H, H, yr, 0, rows, wgu + (I + cb) * H, H, 0, nc, m0 == 0); /* up */
            for (int64_t r = 0; r < rows; r++) {
                const float *g = buf + r * 2 * NH;
                es_silu_mul(g, g + nc, h, nc);
                const float *hr = h;
                round_rows(&hr, hb + (m0 + r) * I + cb, 1, nc, nc);
            }
        }
    }
}

/* out's columns [n0, n1) from one expert's M rows of h (hb, stride I) and its down rows wd: MB
 * rows at a time into ybuf (this thread's, MB x (n1 - n0) floats), then each row's sums scaled by
 * its slot's weight and stored (a token's first slot) or added (its second). */
static KB void down_block(const uint16_t *hb, const uint16_t *wd, float *out, int64_t H, int64_t I, int64_t M,
                          const int64_t *tok, const float *slot_w, const unsigned char *first, int64_t n0, int64_t n1,
                          float *ybuf, float **yr) {
    const int64_t nn = n1 - n0;
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
        const int64_t rows = M - m0 < MB ? M - m0 : MB;
        for (int64_t r = 0; r < rows; r++) yr[r] = ybuf + r * nn;
        block_rows(hb + m0 * I, I, yr, 0, rows, wd + n0 * I, I, 0, nn, m0 == 0);
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + tok[m0 + r] * H + n0;
            const float *y = ybuf + r * nn, w = slot_w[m0 + r];
            if (first[m0 + r])
                for (int64_t j = 0; j < nn; j++) o[j] = w * y[j];
            else
                for (int64_t j = 0; j < nn; j++) o[j] = o[j] + w * y[j];
        }
    }
}

KB int es_moe_bf16dot_fused(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu,
                            const uint16_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I) {
    const int64_t S = T * k;
    for (int64_t s = 0; s < S; s++)
        if (ids[s] < 0 || ids[s] >= E) return 1;
    const size_t n64 = sizeof(int64_t) * (size_t)E, s64 = sizeof(int64_t) * (size_t)S;
    const size_t bytes[9] = {n64, n64, n64, s64, s64, sizeof(float) * (size_t)S, (size_t)S,
                             sizeof(uint16_t) * (size_t)(S * H), sizeof(uint16_t) * (size_t)(S * I)};
    void *pt[9];
    if (es_scratch_parts(ES_SCRATCH_MOE, 9, bytes, pt)) return 2;
    int64_t *count = pt[0], *offset = pt[1], *fill = pt[2], *pos = pt[3], *tok = pt[4];
    float *slot_w = pt[5];
    unsigned char *first = pt[6];
    uint16_t *xb = pt[7], *hb = pt[8];
    es_moe_group(ids, S, E, count, offset, fill, pos);
    es_moe_combine_order(pos, wts, S, k, tok, slot_w, first);
    int oom = 0;
#pragma omp parallel if (S * H * I >= PARALLEL_MIN_MACS)
    {
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const size_t tb[3] = {sizeof(float) * MB * 2 * NH, sizeof(float) * (size_t)(MB * H), sizeof(float *) * MB};
        void *tp[3];
        if (es_scratch_parts(ES_SCRATCH_EPILOGUE, 3, tb, tp)) {
#pragma omp atomic write
            oom = 1;
        }
        int64_t lo, hi;
        share(S, &lo, &hi);
        for (int64_t s = 0; s < S; s++) /* this thread's share of the slot rows, rounded once */
            if (pos[s] >= lo && pos[s] < hi) {
                const float *xr = x + (s / k) * H;
                round_rows(&xr, xb + pos[s] * H, 1, H, H);
            }
        const int64_t c0 = I / 32 * tid / nt * 32, c1 = I / 32 * (tid + 1) / nt * 32;
#pragma omp barrier
        for (int64_t e = 0; e < E && !oom; e++)
            if (count[e] && c1 > c0)
                gate_up_block(xb + offset[e] * H, w_gu + e * 2 * I * H, hb + offset[e] * I, count[e], H, I, c0, c1,
                              tp[0], tp[2]);
#pragma omp barrier
        share(H, &lo, &hi);
        for (int64_t e = 0; e < E && !oom; e++)
            if (count[e] && hi > lo)
                down_block(hb + offset[e] * I, w_d + e * H * I, out, H, I, count[e], tok + offset[e],
                           slot_w + offset[e], first + offset[e], lo, hi, tp[1], tp[2]);
    }
    return oom ? 2 : 0;
}
