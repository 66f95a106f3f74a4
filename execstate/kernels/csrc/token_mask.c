/* Allowed-token masks applied to logits rows (engine/token_mask.py, llguidance's bit layout): in
 * one pass per row, no unpacked [rows, vocab] boolean tensor. The values are those of torch's
 * masked_fill with -inf, so the two paths give the same logits. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Row r = rows[i] of x [*, V] (row stride V): tokens whose bit is clear in bits[i] (words of 32)
 * become -inf. Where fallback is given and the row is then all -inf, the row becomes fallback's
 * row r with the same mask (the grammar decides over the request's own bans). */
static void mask_row(float *x, const float *fb, const uint32_t *bits, int64_t V) {
    int any = 0;
    for (int64_t v = 0; v < V; v++) {
        if (!((bits[v >> 5] >> (v & 31)) & 1u)) x[v] = -INFINITY;
        else any |= !(isinf(x[v]) && x[v] < 0);
    }
    if (any || !fb) return;
    for (int64_t v = 0; v < V; v++) x[v] = ((bits[v >> 5] >> (v & 31)) & 1u) ? fb[v] : -INFINITY;
}

/* mask_logits(x, fallback or 0, rows, k, bits, words, V): data pointers (x, fallback fp32 [*, V];
 * rows int64 [k], each a row of x; bits int32 [k, words], words >= ceil(V / 32)). */
PyObject *es_py_mask_logits(PyObject *self, PyObject *args) {
    unsigned long long x, fb, rows, bits;
    Py_ssize_t k, words, V;
    if (!PyArg_ParseTuple(args, "KKKnKnn", &x, &fb, &rows, &k, &bits, &words, &V)) return NULL;
    if (k < 0 || V < 0 || words * 32 < V) return PyErr_Format(PyExc_ValueError, "mask_logits: bad sizes");
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        const int64_t r = ((const int64_t *)rows)[i];
        mask_row((float *)x + r * V, fb ? (const float *)fb + r * V : NULL, (const uint32_t *)bits + i * words, V);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
