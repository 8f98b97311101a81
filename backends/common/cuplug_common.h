/*
 * Pieces shared by every backend framework (CPU in C11, CUDA in nvcc C++17):
 * bounded text output, per-instance error text, shape arithmetic, and the
 * resident tensor table. cuplug_cpu_backend.h and cuplug_cuda_backend.cuh
 * build the C ABI of cuplug/backend.h on them (with cuplug_signature.h for the
 * call checks and the ops JSON). Header-only (static inline), so each backend
 * .so carries its own copy and exports nothing extra.
 */
#ifndef CUPLUG_COMMON_H
#define CUPLUG_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuplug/backend.h"
#include "cuplug_ops.h"

#define CUPLUG_ERR_LEN 512
/* DLPack allows any ndim; cuplug accepts 0..32 (PyTorch's own limit is 25...64). */
#define CUPLUG_MAX_NDIM 32

/* Copies text into (buf, len) NUL-terminated, truncating; returns the full length. */
static inline int cuplug_write_text(const char* text, char* buf, int len) {
    size_t need = strlen(text);
    if (buf != NULL && len > 0) {
        size_t n = need < (size_t)(len - 1) ? need : (size_t)(len - 1);
        memcpy(buf, text, n);
        buf[n] = '\0';
    }
    return need > 0x7fffffff ? 0x7fffffff : (int)need;
}

static inline void cuplug_vformat(char* dst, const char* fmt, va_list ap) { vsnprintf(dst, CUPLUG_ERR_LEN, fmt, ap); }

/* snprintf into (err, err_len) if err is not NULL; returns CUPLUG_E_INVALID_ARGUMENT. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int cuplug_errorf(char* err, size_t err_len, const char* fmt, ...) {
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return CUPLUG_E_INVALID_ARGUMENT;
}

/* Bytes of one element of a dtype cuplug knows; 0 for any other (or lanes != 1). */
static inline int cuplug_dtype_size(cuplug_dtype d) {
    unsigned bit = cuplug_dtype_bit(d);
    for (int i = 0; i < CUPLUG_DTYPE_COUNT; ++i)
        if (bit != 0 && cuplug_dtypes[i].bit == bit) return cuplug_dtypes[i].size;
    return 0;
}

/* "(3, 4)", "(5,)" or "()" (Python's spelling) into (buf, len); returns buf. */
static inline const char* cuplug_shape_text(int ndim, const int64_t* shape, char* buf, size_t len) {
    size_t used = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    int w = snprintf(buf, len, "(");
    used = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && shape != NULL && used < len; ++i) {
        w = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < len) snprintf(buf + used, len - used, ndim == 1 ? ",)" : ")");
    return buf;
}

/*
 * Checks a shape: ndim in 0..CUPLUG_MAX_NDIM, shape non-NULL when ndim > 0,
 * extents >= 0, and numel * itemsize fits in int64. Zero extents are allowed
 * (numel 0). On success stores numel and the byte size and returns CUPLUG_OK;
 * otherwise writes "<what>: ..." into err and returns CUPLUG_E_INVALID_ARGUMENT.
 */
static inline int cuplug_check_shape(const char* what, int ndim, const int64_t* shape, int itemsize,
                                     long long* numel, long long* nbytes, char* err, size_t err_len) {
    if (ndim < 0 || ndim > CUPLUG_MAX_NDIM)
        return cuplug_errorf(err, err_len, "%s: ndim must be in 0..%d, got %d", what, CUPLUG_MAX_NDIM, ndim);
    if (ndim > 0 && shape == NULL) return cuplug_errorf(err, err_len, "%s: NULL shape with ndim %d", what, ndim);
    if (itemsize <= 0) return cuplug_errorf(err, err_len, "%s: unknown dtype", what);
    for (int i = 0; i < ndim; ++i)
        if (shape[i] < 0)
            return cuplug_errorf(err, err_len, "%s: extent %lld of dimension %d is negative", what,
                                 (long long)shape[i], i);
    /* Any zero extent makes numel 0, whatever the others are. */
    long long n = 1;
    int zero = 0;
    for (int i = 0; i < ndim; ++i) zero |= shape[i] == 0;
    if (zero) {
        n = 0;
    } else {
        const long long limit = INT64_MAX / itemsize;
        for (int i = 0; i < ndim; ++i) {
            if (n > limit / shape[i]) {
                char s[256];
                return cuplug_errorf(err, err_len, "%s: shape %s has too many elements (%d-byte items overflow int64)",
                                     what, cuplug_shape_text(ndim, shape, s, sizeof s), itemsize);
            }
            n *= shape[i];
        }
    }
    if (numel) *numel = n;
    if (nbytes) *nbytes = n * itemsize;
    return CUPLUG_OK;
}

/*
 * Resident tensor table.
 *
 * An id is (generation << 32) | (slot + 1), always > 0. Slots are reused after
 * free (most recently freed first), and every occupation of a slot takes a new
 * generation from ONE process-wide counter (an atomic, shared by every table of
 * this library), so:
 *  - a freed or stale id never matches: its slot's generation has moved on;
 *  - an id of another live instance never matches: that generation value was
 *    handed to the other instance's allocation, never to one of this table.
 * The counter starts at a per-library-load pseudo-random base (so ids of two
 * different backend libraries in one process rarely overlap either) and wraps
 * within 1..2^31-1 (a repeat needs 2^31 allocations in between).
 *
 * Slot storage is stable (blocks of CUPLUG_TABLE_BLOCK slots that never move),
 * so cuplug_backend_tensor() may point a descriptor's shape into it until free.
 * Not thread-safe: the framework holds the instance lock around every use.
 */
#define CUPLUG_TABLE_BLOCK 256
#define CUPLUG_TABLE_MAX_SLOTS 0x7fffff00u

typedef struct cuplug_resident {
    void* ptr;         /* host memory (CPU) or device memory (CUDA); NULL: slot free */
    long long nbytes;  /* numel * itemsize */
    long long numel;
    cuplug_dtype dtype;
    int32_t ndim;
    uint32_t generation; /* of the current (or last) occupant */
    uint32_t next_free;  /* free list link: slot + 1, 0 ends it */
    uint32_t slot;
    int live;
    int64_t shape[CUPLUG_MAX_NDIM];
} cuplug_resident;

typedef struct cuplug_tensor_table {
    cuplug_resident** blocks; /* blocks[i / CUPLUG_TABLE_BLOCK][i % CUPLUG_TABLE_BLOCK] */
    uint32_t nblocks;
    uint32_t count;     /* slots ever used */
    uint32_t free_head; /* slot + 1 of the most recently freed slot, 0: none */
    uint32_t live;      /* tensors allocated now */
} cuplug_tensor_table;

static uint32_t cuplug_generation_counter; /* one per library: static in a header-only file */

/* A new generation in 1..2^31-1, unique among the last 2^31-1 taken in this library. */
static inline uint32_t cuplug_next_generation(void) {
    uint32_t cur = __atomic_load_n(&cuplug_generation_counter, __ATOMIC_RELAXED);
    for (;;) {
        uint32_t base = cur;
        if (base == 0) { /* first use: a pseudo-random start (address and clock mixed) */
            uint64_t z = (uint64_t)(uintptr_t)&cuplug_generation_counter ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)clock();
            z ^= z >> 33, z *= 0xff51afd7ed558ccdULL, z ^= z >> 33, z *= 0xc4ceb9fe1a85ec53ULL, z ^= z >> 33;
            base = (uint32_t)(z & 0x3fffffffu) + 1u; /* leave room before the wrap */
        }
        uint32_t next = base >= 0x7fffffffu ? 1u : base + 1u;
        if (__atomic_compare_exchange_n(&cuplug_generation_counter, &cur, next, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return next;
    }
}

static inline cuplug_resident* cuplug_table_slot(const cuplug_tensor_table* t, uint32_t slot) {
    return &t->blocks[slot / CUPLUG_TABLE_BLOCK][slot % CUPLUG_TABLE_BLOCK];
}

/*
 * Records a new resident tensor (ptr must not be NULL; for a 0-byte tensor
 * allocate 1 byte). Returns its id, or CUPLUG_E_OUT_OF_MEMORY if the table
 * cannot grow. shape is copied (ndim must already be checked: 0..32).
 */
static inline long long cuplug_table_add(cuplug_tensor_table* t, void* ptr, cuplug_dtype dtype, int ndim,
                                         const int64_t* shape, long long numel, long long nbytes) {
    uint32_t slot;
    if (t->free_head != 0) {
        slot = t->free_head - 1;
        t->free_head = cuplug_table_slot(t, slot)->next_free;
    } else {
        if (t->count >= CUPLUG_TABLE_MAX_SLOTS) return CUPLUG_E_OUT_OF_MEMORY;
        if (t->count == t->nblocks * CUPLUG_TABLE_BLOCK) {
            cuplug_resident** grown =
                (cuplug_resident**)realloc(t->blocks, (size_t)(t->nblocks + 1) * sizeof(cuplug_resident*));
            if (grown == NULL) return CUPLUG_E_OUT_OF_MEMORY;
            t->blocks = grown;
            grown[t->nblocks] = (cuplug_resident*)calloc(CUPLUG_TABLE_BLOCK, sizeof(cuplug_resident));
            if (grown[t->nblocks] == NULL) return CUPLUG_E_OUT_OF_MEMORY;
            t->nblocks += 1;
        }
        slot = t->count++;
    }
    cuplug_resident* r = cuplug_table_slot(t, slot);
    r->ptr = ptr;
    r->nbytes = nbytes;
    r->numel = numel;
    r->dtype = dtype;
    r->ndim = ndim;
    for (int i = 0; i < CUPLUG_MAX_NDIM; ++i) r->shape[i] = i < ndim ? shape[i] : 0;
    r->generation = cuplug_next_generation();
    r->next_free = 0;
    r->slot = slot;
    r->live = 1;
    t->live += 1;
    return (long long)(((uint64_t)r->generation << 32) | ((uint64_t)slot + 1));
}

/* The live tensor behind id, or NULL for a stale, freed, foreign or made-up id. */
static inline cuplug_resident* cuplug_table_get(const cuplug_tensor_table* t, long long id) {
    if (id <= 0) return NULL;
    uint64_t u = (uint64_t)id;
    uint32_t generation = (uint32_t)(u >> 32), slot1 = (uint32_t)(u & 0xffffffffu);
    if (generation == 0 || slot1 == 0 || slot1 > t->count) return NULL;
    cuplug_resident* r = cuplug_table_slot(t, slot1 - 1);
    return r->live && r->generation == generation ? r : NULL;
}

/* Forgets a live tensor (from cuplug_table_get); returns its ptr for the caller to free. */
static inline void* cuplug_table_remove(cuplug_tensor_table* t, cuplug_resident* r) {
    void* ptr = r->ptr;
    r->ptr = NULL;
    r->live = 0;
    r->next_free = t->free_head;
    t->free_head = r->slot + 1;
    t->live -= 1;
    return ptr;
}

/* Calls release(ptr, ctx) for every live tensor, then frees the table's own memory. */
static inline void cuplug_table_clear(cuplug_tensor_table* t, void (*release)(void* ptr, void* ctx), void* ctx) {
    for (uint32_t i = 0; i < t->count; ++i) {
        cuplug_resident* r = cuplug_table_slot(t, i);
        if (r->live && release != NULL) release(r->ptr, ctx);
    }
    for (uint32_t b = 0; b < t->nblocks; ++b) free(t->blocks[b]);
    free(t->blocks);
    memset(t, 0, sizeof *t);
}

/* Fills a descriptor of a resident tensor: shape points into the table, strides NULL, byte_offset 0. */
static inline void cuplug_resident_descriptor(cuplug_resident* r, int32_t device_type, int32_t device_id,
                                              cuplug_tensor* out) {
    out->data = r->ptr;
    out->device_type = device_type;
    out->device_id = device_id;
    out->ndim = r->ndim;
    out->dtype = r->dtype;
    out->shape = r->shape; /* valid memory even for ndim 0 */
    out->strides = NULL;
    out->byte_offset = 0;
}

#endif /* CUPLUG_COMMON_H */
