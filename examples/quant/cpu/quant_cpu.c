/* The CPU twin of the `quant` backend: the same two ops in plain C, with the
 * arithmetic of ../common/quant_math.h that the CUDA kernels use, so q, absmax and
 * the dequantized values are bit-identical to theirs. cuplug's
 * cuplug_cpu_backend.h supplies the whole C ABI around the table. */
#include <stdint.h>

#include "../common/quant_math.h"
#include "cuplug_ops.h"

typedef float (*quant_widen_fn)(uint16_t);

/* One block of n <= blocksize float32 values: absmax and q. */
static float quant_block_f32(const float* x, int8_t* q, long long n) {
    uint32_t m = 0;
    for (long long i = 0; i < n; ++i) {
        const uint32_t a = quant_abs_bits(x[i]);
        m = a > m ? a : m;
    }
    const float amax = quant_absmax_from_bits(m), scale = quant_scale(amax);
    for (long long i = 0; i < n; ++i) q[i] = quant_one(x[i], scale);
    return amax;
}

/* The same for float16 / bfloat16 bits, widened once into `tmp`. */
static float quant_block_16(const uint16_t* x, int8_t* q, long long n, quant_widen_fn widen, float* tmp) {
    for (long long i = 0; i < n; ++i) tmp[i] = widen(x[i]);
    return quant_block_f32(tmp, q, n);
}

static int quantize_blockwise(const cuplug_call* c) {
    const long long bs = cuplug_attr_int(c, "blocksize");
    if (!quant_blocksize_ok(bs)) return cuplug_op_fail(c, "blocksize must be a power of two in [64, 4096], got %lld", bs);
    const unsigned dt = cuplug_dtype_bit(c->in[0].dtype);
    int8_t* q = (int8_t*)c->out[0].data;
    float* absmax = (float*)c->out[1].data;
    float tmp[QUANT_MAX_BLOCKSIZE];
    for (long long start = 0, b = 0; start < c->n; start += bs, ++b) {
        const long long len = c->n - start < bs ? c->n - start : bs;
        if (dt == CUPLUG_F32)
            absmax[b] = quant_block_f32((const float*)c->in[0].data + start, q + start, len);
        else if (dt == CUPLUG_F16)
            absmax[b] = quant_block_16((const uint16_t*)c->in[0].data + start, q + start, len, quant_f16_to_float, tmp);
        else if (dt == CUPLUG_BF16)
            absmax[b] = quant_block_16((const uint16_t*)c->in[0].data + start, q + start, len, quant_bf16_to_float, tmp);
        else
            return cuplug_op_fail(c, "x must be float16, bfloat16 or float32, got %s", cuplug_dtype_name(c->in[0].dtype));
    }
    return CUPLUG_OK;
}

static int dequantize_blockwise(const cuplug_call* c) {
    const long long bs = cuplug_attr_int(c, "blocksize");
    if (!quant_blocksize_ok(bs)) return cuplug_op_fail(c, "blocksize must be a power of two in [64, 4096], got %lld", bs);
    const long long blocks = (c->n + bs - 1) / bs, have = cuplug_numel(&c->in[1]);
    if (have != blocks)
        return cuplug_op_fail(c, "absmax has %lld elements; q of %lld elements in blocks of %lld needs %lld", have, c->n,
                              bs, blocks);
    const int8_t* q = (const int8_t*)c->in[0].data;
    const float* absmax = (const float*)c->in[1].data;
    float* out = (float*)c->out[0].data;
    for (long long start = 0, b = 0; start < c->n; start += bs, ++b) {
        const long long end = c->n - start < bs ? c->n : start + bs;
        const float dscale = quant_dequant_scale(absmax[b]);
        for (long long i = start; i < end; ++i) out[i] = quant_dequant_one(q[i], dscale);
    }
    return CUPLUG_OK;
}

#include "../common/quant_ops_table.h"
#include "cuplug_cpu_backend.h"
