/* Per-thread scratch buffers for the kernels' large temporaries (packed rows, expert
 * activations), kept between calls.
 *
 * Why: a prefill step's MoE call needs ~50 MB of temporaries per layer. With malloc/free per
 * call, glibc serves them from mmap or from a heap it trims on free (its thresholds move
 * with the process's whole allocation history), so the same call page-faults its
 * temporaries anew: measured 140k minor faults and 25 % sys time per 2,048-token prefill,
 * 5.5k -> 4.0k tok/s, once a second engine had been used in the process. Here each thread
 * keeps one mapping per slot, grown (never shrunk) to the largest request, advised for
 * transparent huge pages and mapped in at once when it grows (MADV_POPULATE_WRITE, where the
 * kernel has it: the faults, and the huge pages' compaction, all in the growing call, also
 * for the parts of a slot that its grower leaves untouched but a later kernel uses), and
 * unmapped when the thread exits.
 *
 * Contract: es_scratch(slot, bytes) returns this thread's buffer for `slot`, 64-byte
 * aligned, at least `bytes` long, or NULL when out of memory. Its contents are undefined,
 * and it stays valid until this thread's next es_scratch call with the same slot, so a
 * kernel takes each slot once per call and kernels that run inside another kernel use
 * their own slots. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>

#include "kernels.h"

typedef struct {
    void *p;
    size_t cap;
} Slot;

static _Thread_local Slot slots[ES_SCRATCH_SLOTS];
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void release(void *unused) {
    (void)unused;
    for (int s = 0; s < ES_SCRATCH_SLOTS; s++) {
        if (slots[s].p) munmap(slots[s].p, slots[s].cap);
        slots[s].p = NULL;
        slots[s].cap = 0;
    }
}

static void make_key(void) { pthread_key_create(&exit_key, release); }

void *es_scratch(int slot, size_t bytes) {
    Slot *s = &slots[slot];
    if (s->p && bytes <= s->cap) return s->p; /* also for bytes == 0: a valid buffer */
    const size_t huge = (size_t)2 << 20, cap = (bytes + huge - 1) & ~(huge - 1);
    if (s->p) munmap(s->p, s->cap);
    s->p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->p == MAP_FAILED) {
        s->p = NULL;
        s->cap = 0;
        return NULL;
    }
    s->cap = cap;
    madvise(s->p, cap, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
    madvise(s->p, cap, MADV_POPULATE_WRITE); /* best effort: else the first touches fault as before */
#endif
    pthread_once(&key_once, make_key);
    pthread_setspecific(exit_key, slots); /* non-NULL: run release at thread exit */
    return s->p;
}

int es_scratch_parts(int slot, int n, const size_t *bytes, void **parts) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (bytes[i] + 63) & ~(size_t)63;
    char *p = es_scratch(slot, total ? total : 64);
    if (!p) return 2;
    for (int i = 0; i < n; i++) {
        parts[i] = p;
        p += (bytes[i] + 63) & ~(size_t)63;
    }
    return 0;
}
