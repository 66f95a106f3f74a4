/* The whole-layer decode entry (decode_layer.c): its arguments and its Python binding. */
#ifndef EXECSTATE_DECODE_LAYER_H
#define EXECSTATE_DECODE_LAYER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Optional pointers are NULL when absent. x [T, H] is updated in place (the residual stream).
 * Each matrix (w_qkv, w_o, w_router, w_gu, w_d) is stored and multiplied in its fmt (kernels.h
 * ES_FMT_*: fp32, bf16 widened, bf16 arithmetic, GGUF blocks); everything else is fp32. */
typedef struct {
    float *x;
    const float *in_norm, *b_qkv, *q_norm, *k_norm, *cos, *sin;         /* cos/sin [T, d] */
    const void *w_qkv;
    float *k_cache, *v_cache;                                           /* the layer's [slots, nkv, d] */
    const int64_t *slots, *tok, *block_table, *ctx_len;                 /* [T], [T], [T, max_blocks], [T] */
    const void *w_o;
    const float *b_o, *post_norm;
    float *h_out;                                                       /* [T, H] post-norm output, or NULL */
    const void *w_router;                                               /* [E, H] (MoE layer) */
    float *logits_out;                                                  /* [T, E] */
    const void *w_gu, *w_d;                                             /* [2I, H], [H, I] (dense layer) */
    int64_t T, H, nh, nkv, d, max_blocks, block_size, E, I;
    int fmt[5]; /* ES_FMT_* of w_qkv, w_o, w_router, w_gu, w_d */
    double *timers;        /* [timer_threads, ES_T_COUNT] phase times added (ns, step_clock.h), or NULL */
    int64_t timer_threads;
    int timer_cpu; /* 1: the timers read each thread's CPU time, 0: wall time */
    float eps, scale;
} EsDecodeLayer;

/* 0 ok, 2 out of memory. */
int es_decode_layer(const EsDecodeLayer *a);
PyObject *es_py_decode_layer(PyObject *self, PyObject *args);

#endif
