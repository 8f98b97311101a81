/*
 * The `quant` backend's op table, included by cuda/quant.cu and cpu/quant_cpu.c
 * after each defines quantize_blockwise() and dequantize_blockwise(): one
 * signature for both, which the loader reads from the ping JSON to validate calls
 * and allocate outputs before anything reaches C.
 *
 *   quantize_blockwise(x: float16|bfloat16|float32, blocksize=256)
 *       -> q: int8 shaped like x, absmax: float32 (ceil(numel(x) / blocksize),)
 *   dequantize_blockwise(q: int8, absmax: float32, blocksize=256)
 *       -> out: float32 shaped like q
 *
 * The ops check blocksize (a power of two in [64, 4096]) and the length of absmax
 * themselves (cuplug_op_fail). sample_n: probe/warmup samples of 4096 elements.
 */
#ifndef QUANT_OPS_TABLE_H
#define QUANT_OPS_TABLE_H

#define QUANT_FLOAT_INPUTS (CUPLUG_F16 | CUPLUG_BF16 | CUPLUG_F32)

static const cuplug_op cuplug_ops[] = {
    {"quantize_blockwise",
     quantize_blockwise,
     0,
     {CUPLUG_IN("x", QUANT_FLOAT_INPUTS)},
     {CUPLUG_OUT("q", CUPLUG_DT_FIXED, CUPLUG_I8, CUPLUG_SHAPE_LIKE, 0, NULL),
      CUPLUG_OUT("absmax", CUPLUG_DT_FIXED, CUPLUG_F32, CUPLUG_SHAPE_BLOCKS, 0, "blocksize")},
     {CUPLUG_ATTR_INT("blocksize", 256)},
     {{0, 0, 0, 0}},
     4096},
    {"dequantize_blockwise",
     dequantize_blockwise,
     0,
     {CUPLUG_IN("q", CUPLUG_I8), CUPLUG_IN_SHAPED("absmax", CUPLUG_F32, CUPLUG_SHAPE_BLOCKS, 0, "blocksize")},
     {CUPLUG_OUT("out", CUPLUG_DT_FIXED, CUPLUG_F32, CUPLUG_SHAPE_LIKE, 0, NULL)},
     {CUPLUG_ATTR_INT("blocksize", 256)},
     {{0, 0, 0, 0}},
     4096},
};

#endif /* QUANT_OPS_TABLE_H */
