/* Entry points of the execstate CPU kernels (each file: one kernel family). Callers validate
 * shapes, dtypes and contiguity (the Python wrappers in execstate/kernels/); these trust their pointers.
 * Return codes: 0 ok, 1 expert id out of range (moe), 2 out of memory; nothing is written
 * on a non-zero return. */
#ifndef EXECSTATE_KERNELS_H
#define EXECSTATE_KERNELS_H

#include <stdint.h>
#include <stddef.h>

/* scratch.c: this thread's reusable buffer per slot (64-byte aligned, >= bytes, NULL when out
 * of memory; valid until the thread's next call for the same slot). One slot per use site
 * that can be live at once. */
enum {
    ES_SCRATCH_PACKED,
    ES_SCRATCH_MOE,
    ES_SCRATCH_WIDEN,
    ES_SCRATCH_ROWS,
    ES_SCRATCH_ATTENTION,
    ES_SCRATCH_LAYER,
    ES_SCRATCH_SHARED_ROWS, /* es_linear_bf16dot's bf16 rows, shared by its team */
    ES_SCRATCH_EPILOGUE,    /* this thread's block of product rows before its epilogue (es_linear_qkv_*, the fused MoE) */
    ES_SCRATCH_SLOTS
};
void *es_scratch(int slot, size_t bytes);
/* parts[i] = a 64-byte aligned piece of bytes[i] of this thread's `slot` buffer, i < n (the
 * pieces do not overlap). Returns 0, or 2 when out of memory. */
int es_scratch_parts(int slot, int n, const size_t *bytes, void **parts);

/* Weight formats (execstate/kernels/formats.py WeightFormat): how a matrix is stored and which
 * row kernel multiplies it. */
enum { ES_FMT_F32, ES_FMT_BF16, ES_FMT_BF16_DOT, ES_FMT_Q8_0, ES_FMT_Q4_0, ES_FMT_Q4_1, ES_FMT_COUNT };

/* gemm.c; one weight format's dot products (weight rows [n0, n1) for every x row) plug into
 * the shared linear and MoE drivers es_linear_with / es_moe_with */
typedef void (*es_rows_fn)(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                           int64_t n1);
int es_linear_with(es_rows_fn rows, const float *x, const void *w, float *y, int64_t M, int64_t K, int64_t N);
/* The MoE drivers' slot layout and the fused ones' combine order (gemm.c). */
void es_moe_group(const int64_t *ids, int64_t S, int64_t E, int64_t *count, int64_t *offset, int64_t *fill,
                  int64_t *pos);
void es_moe_combine_order(const int64_t *pos, const float *wts, int64_t S, int64_t k, int64_t *tok, float *slot_w,
                          unsigned char *first);
int es_moe_with(es_rows_fn rows, size_t bytes32, const float *x, const int64_t *ids, const float *wts, const void *w_gu,
                const void *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
int es_linear_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_f32(const float *x, const int64_t *ids, const float *wts, const float *w_gu, const float *w_d, float *out,
               int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
void es_linear_rows_f32(const float *const *xr, float *const *yr, int64_t M, const float *w, int64_t K, int64_t n0,
                        int64_t n1);
/* gemm_bf16.c: the same with bf16 weights (uint16 bit patterns), fp32 activations and sums */
int es_linear_bf16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_bf16(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
void es_linear_rows_bf16(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                         int64_t n1); /* w: bf16 [N, K] */
/* gemm_bf16_pairs.c (AVX-512 BW): the same dot products, bit for bit, for 2+ rows; 0 or 2 (no memory) */
int es_bf16_pairs_available(void);
int es_linear_rows_bf16_pairs(const float *const *xr, float *const *yr, int64_t M, const uint16_t *w, int64_t K,
                              int64_t n0, int64_t n1);
/* gemm_bf16dot.c (AVX512-BF16): bf16 arithmetic, x rounded to bf16, vdpbf16ps, the "bf16 dot
 * order"; gemm_bf16dot_emu.c: the same order with fp32 FMAs (AVX2), equal bits but subnormals */
int es_bf16dot_available(void);
void es_linear_rows_bf16dot(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K, int64_t n0,
                            int64_t n1);
int es_linear_bf16dot(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_bf16dot(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                   float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
/* es_moe_bf16dot for many tokens, fused (moe_bf16dot.c): the same results bit for bit where
 * es_moe_bf16dot_fused_applies(H, I, k). */
int es_moe_bf16dot_fused_applies(int64_t H, int64_t I, int64_t k);
int es_moe_bf16dot_fused(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                         float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
void es_linear_rows_bf16dot_emu(const float *const *xr, float *const *yr, int64_t M, const void *w, int64_t K,
                                int64_t n0, int64_t n1);
int es_linear_bf16dot_emu(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_bf16dot_emu(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu, const uint16_t *w_d,
                       float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
/* gemm_gguf.c: GGUF Q8_0 / Q4_0 / Q4_1 blocks (fmt ES_FMT_Q*), dequantised in registers, fp32
 * activations and sums in the "GGUF dot order"; K a multiple of 32. avx2: the 8-lane kernels
 * (also what runs where the CPU lacks AVX-512; the same bits). */
int es_gguf_available(void); /* AVX2, FMA and F16C */
es_rows_fn es_gguf_rows(int fmt, int avx2);
int es_gguf_block_bytes(int fmt);
int es_linear_gguf(int fmt, int avx2, const float *x, const uint8_t *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_gguf(int fmt, int avx2, const float *x, const int64_t *ids, const float *wts, const uint8_t *w_gu,
                const uint8_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
/* gemm_packed.c (AVX-512; returns 3 where the CPU lacks it) */
int es_gemm_packed_available(void);
/* x rows xr[0..M) packed in pairs, pairs [p0, p1): xp[p][k/8] = 8 floats of row 2p ++ 8 of row
 * 2p + 1 (zeros for a missing odd row), K & ~7 columns; the layout of the 16-lane kernels */
void es_pack_pairs(const float *const *xr, float *xp, int64_t M, int64_t K, int64_t p0, int64_t p1);
int es_linear_packed_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_packed_f32(const float *x, const int64_t *ids, const float *wts, const float *w_gu, const float *w_d,
                      float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
/* the same with bf16 weights: bitwise es_linear_bf16 / es_moe_bf16 */
int es_linear_packed_bf16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t K, int64_t N);
int es_moe_packed_bf16(const float *x, const int64_t *ids, const float *wts, const uint16_t *w_gu,
                       const uint16_t *w_d, float *out, int64_t T, int64_t k, int64_t E, int64_t H, int64_t I);
/* attention.c */
int es_decode_attention_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                            const int64_t *block_table, const int64_t *ctx_len, int64_t B, int64_t max_blocks,
                            int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale);
void es_decode_attention_items_f32(const float *q, const float *kc, const float *vc, float *out, const int64_t *tok,
                                   const int64_t *block_table, const int64_t *ctx_len, int64_t max_blocks, int64_t nh,
                                   int64_t nkv, int64_t d, int64_t bs, float scale, int64_t i0, int64_t i1, float *sc);
/* prefill_attention.c (nh / nkv <= 16); es_decode_attention_kv: decode attention by (entry, KV
 * head) items on the calling thread, the bits of es_decode_attention_f32. kv_bf16: the caches
 * hold bf16 (uint16 bit patterns), widened exactly; the arithmetic is fp32 either way, so the
 * results equal the fp32 kernel's on the widened values bit for bit. */
int es_decode_attention_kv(const float *q, const void *kc, const void *vc, int kv_bf16, float *out, const int64_t *tok,
                           const int64_t *block_table, const int64_t *ctx_len, int64_t max_blocks, int64_t nh,
                           int64_t nkv, int64_t d, int64_t bs, float scale, int64_t lmax, int64_t i0, int64_t i1);
int es_prefill_attention_f32(const float *q, const void *kc, const void *vc, int kv_bf16, float *out,
                             const int64_t *tok, const int64_t *block_table, const int64_t *ctx_len, int64_t B,
                             int64_t max_blocks, int64_t nh, int64_t nkv, int64_t d, int64_t bs, float scale);
/* fused.c */
void es_silu_mul(const float *g, const float *u, float *h, int64_t n);
void es_sigmoid(const float *x, float *y, int64_t n);
void es_rms_norm_f32(const float *x, const float *w, float *out, int64_t T, int64_t H, float eps);
void es_add_rms_norm_f32(const float *x, const float *a, const float *w, float *s, float *out, int64_t T, int64_t H,
                         float eps);
void es_qkv_rope_f32(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                     float eps, float *q, float *k, float *v, const int64_t *slots, int64_t T, int64_t nh, int64_t nkv,
                     int64_t d);
void es_qkv_rope_head(const float *qkv, const float *cos, const float *sin, const float *qw, const float *kw,
                      float eps, float *q, float *k, float *v, int64_t t, int64_t head, int64_t nh, int64_t nkv,
                      int64_t d);
/* The q/k/v linear's epilogue: what es_qkv_rope_f32 does with the product's rows, plus the
 * linear's bias. q [T, nh, d]; k, v [S, nkv, d] with token t's rows at slots[t] (row t without
 * slots); bias [(nh + 2 nkv) d] or NULL; qw, kw [d] (both or neither); cos, sin [T, d]. */
typedef struct {
    const float *bias, *cos, *sin, *qw, *kw;
    float eps;
    float *q, *k, *v;
    const int64_t *slots;
    int64_t nh, nkv, d;
} EsQkvRope;
/* fused.c: rows y[0..n) of the q/k/v product, tokens t0 .. t0 + n (y modified: the bias added) */
void es_qkv_rope_rows(const EsQkvRope *e, float *y, int64_t t0, int64_t n);
/* y = x @ w^T (w [N, K], N = (nh + 2 nkv) d) with es_qkv_rope_rows as its epilogue, each thread a
 * share of x's rows, a block of rows at a time, the product's rows in this thread's scratch (no
 * y): the bits of the linear (es_linear_packed_f32 / es_linear_bf16dot), the bias add and
 * es_qkv_rope_f32. 0, 2 when out of memory, 3 without AVX-512 (-BF16). */
int es_linear_qkv_packed_f32(const float *x, const float *w, int64_t M, int64_t K, const EsQkvRope *e);
int es_linear_qkv_bf16dot(const float *x, const uint16_t *w, int64_t M, int64_t K, const EsQkvRope *e);
/* The pre-norm block's residual add and the next RMSNorm after a linear: s[T, H] = x + (a + bias),
 * out = rms_norm(s) * w, a the linear's rows (bias [H] or NULL). */
typedef struct {
    const float *bias, *x, *w;
    float *s, *out;
    float eps;
    int64_t H;
} EsAddNorm;
/* fused.c: rows y[0..n) of the linear's product, tokens t0 .. t0 + n (y modified: the bias added) */
void es_add_rms_rows(const EsAddNorm *e, float *y, int64_t t0, int64_t n);
/* y = a @ w^T (w [H, K]) with es_add_rms_rows as its epilogue, as es_linear_qkv_*: the bits of the
 * linear, the bias add and es_add_rms_norm_f32, no y. 0, 2 when out of memory, 3 without AVX-512 (-BF16). */
int es_linear_add_norm_packed_f32(const float *a, const float *w, int64_t M, int64_t K, const EsAddNorm *e);
int es_linear_add_norm_bf16dot(const float *a, const uint16_t *w, int64_t M, int64_t K, const EsAddNorm *e);
/* Either epilogue behind one pointer type, for the linears that run them (gemm_packed.c,
 * gemm_bf16dot.c): rows y[0..n) of the product, tokens t0 .. t0 + n. */
typedef void (*es_epilogue_fn)(const void *e, float *y, int64_t t0, int64_t n);
static inline void es_qkv_epilogue(const void *e, float *y, int64_t t0, int64_t n) { es_qkv_rope_rows(e, y, t0, n); }
static inline void es_add_norm_epilogue(const void *e, float *y, int64_t t0, int64_t n) { es_add_rms_rows(e, y, t0, n); }
/* decode_moe.c: SparseMoE.route's routing on the kernels (softmax, top-k, forced rows, the
 * top-k renormalised); probs: E floats of scratch. 0, or 1 when a forced id is outside [0, E). */
int es_route(const float *logits, int64_t T, int64_t E, int64_t k, const int64_t *forced, const uint8_t *mask,
             int norm_topk, int64_t *ids, float *wts, float *probs);

#endif
