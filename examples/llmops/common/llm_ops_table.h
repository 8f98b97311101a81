/*
 * The `llm` backend's op table, included by cuda/llm.cu and cpu/llm_cpu.c after each defines the four ops: the
 * interfaces of four public kernels as they are upstream (issue 32), said with shape expressions and the newer
 * dtypes instead of reshapes and attributes that repeat a shape.
 *
 *   layernorm(x: float32 (..., C), weight: float32 (C,) = "x[-1]", bias: float32 "x[-1]", eps=1e-5)
 *       -> y like x, mean: float32 "x[:-1]", rstd: float32 "x[:-1]"        (llm.c's layernorm_forward)
 *   histogram(x: uint8, bins=256) -> hist: uint32 "bins"                    (cuda-samples' histogram)
 *   gelu(x: bfloat16) -> like x                                             (llm.c's bf16 GeLU, tanh form)
 *   softmax(x: float32 (..., C)) -> like x, over the last dimension         (OneFlow's row softmax, CUB)
 */
#ifndef LLM_OPS_TABLE_H
#define LLM_OPS_TABLE_H

static const cuplug_op cuplug_ops[] = {
    {"layernorm",
     layernorm,
     0,
     {CUPLUG_IN("x", CUPLUG_F32), CUPLUG_IN_EXPR("weight", CUPLUG_F32, "x[-1]"),
      CUPLUG_IN_EXPR("bias", CUPLUG_F32, "x[-1]")},
     {CUPLUG_OUT_LIKE("y", 0), CUPLUG_OUT_EXPR("mean", CUPLUG_DT_LIKE, 0, "x[:-1]"),
      CUPLUG_OUT_EXPR("rstd", CUPLUG_DT_LIKE, 0, "x[:-1]")},
     {CUPLUG_ATTR_FLOAT("eps", 1e-5)}},
    {"histogram",
     histogram,
     0,
     {CUPLUG_IN("x", CUPLUG_U8)},
     {CUPLUG_OUT_EXPR("hist", CUPLUG_DT_FIXED, CUPLUG_U32, "bins")},
     {CUPLUG_ATTR_INT("bins", 256)}},
    {"gelu", gelu, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_BF16)}, {CUPLUG_OUT_LIKE("out", 0)}},
    {"softmax", softmax, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
};

#endif /* LLM_OPS_TABLE_H */
