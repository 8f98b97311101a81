/*
 * Pieces shared by every backend implementation (CPU in C, CUDA in C++):
 * bounded text output, per-instance error text, and the resident-buffer table.
 * cuplug_cpu_backend.h and cuplug_cuda_backend.cuh build the C ABI on them.
 * Header-only (static inline) so each backend .so carries its own copy and
 * exports nothing extra.
 */
#ifndef CUPLUG_COMMON_H
#define CUPLUG_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuplug/backend.h"

#define CUPLUG_ERR_LEN 512

/* Copies text into (buf, len) NUL-terminated, truncating; returns full length. */
static inline int cuplug_write_text(const char* text, char* buf, int len) {
    size_t need = strlen(text);
    if (buf != NULL && len > 0) {
        size_t n = need < (size_t)(len - 1) ? need : (size_t)(len - 1);
        memcpy(buf, text, n);
        buf[n] = '\0';
    }
    return (int)need;
}

static inline void cuplug_vformat(char* dst, const char* fmt, va_list ap) {
    vsnprintf(dst, CUPLUG_ERR_LEN, fmt, ap);
}

/* Largest n accepted: the byte count must fit in a signed 64-bit size. */
#define CUPLUG_MAX_ELEMENTS ((long long)(INT64_MAX / 8))

/*
 * Resident buffer table. An id is (instance serial << 32) | (slot + 1), so an id
 * of another instance never matches, and slots are never reused, so a freed id
 * stays invalid. `ptr` is host memory (CPU) or device memory (CUDA).
 */
typedef struct cuplug_buffer {
    void* ptr;
    long long n;
} cuplug_buffer;

typedef struct cuplug_buffer_table {
    long long serial;
    cuplug_buffer* slots;
    long long count;
    long long capacity;
} cuplug_buffer_table;

/* Returns the new id, or CUPLUG_E_OUT_OF_MEMORY if the table cannot grow. */
static inline long long cuplug_table_add(cuplug_buffer_table* t, void* ptr, long long n) {
    if (t->count >= 0xFFFFFFFFLL) return CUPLUG_E_OUT_OF_MEMORY;
    if (t->count == t->capacity) {
        long long cap = t->capacity ? t->capacity * 2 : 16;
        cuplug_buffer* grown = (cuplug_buffer*)realloc(t->slots, (size_t)cap * sizeof(cuplug_buffer));
        if (grown == NULL) return CUPLUG_E_OUT_OF_MEMORY;
        t->slots = grown;
        t->capacity = cap;
    }
    t->slots[t->count].ptr = ptr;
    t->slots[t->count].n = n;
    t->count += 1;
    return (t->serial << 32) | t->count;
}

/* Returns the live buffer behind id, or NULL for a stale, freed or foreign id. */
static inline cuplug_buffer* cuplug_table_get(cuplug_buffer_table* t, long long id) {
    if (id <= 0 || (id >> 32) != t->serial) return NULL;
    long long slot = (id & 0xFFFFFFFFLL) - 1;
    if (slot < 0 || slot >= t->count || t->slots[slot].ptr == NULL) return NULL;
    return &t->slots[slot];
}

#endif /* CUPLUG_COMMON_H */
