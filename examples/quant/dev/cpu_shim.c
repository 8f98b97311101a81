/* Development shim: the CPU twin's two ops without cuplug's framework, behind one
 * exported function, so dev/check.py can compare them (and the CUDA kernels, via
 * dev/kernel_check.cu) with the NumPy reference before the v2 frameworks land.
 *   cc -O3 -ffp-contract=off -shared -fPIC -I<cuplug>/backends/include
 *      -I<cuplug>/backends/common -o libquant_shim.so dev/cpu_shim.c          */
#define CUPLUG_CPU_BACKEND_H /* the framework stays out */
#include "../cpu/quant_cpu.c"

/* op 0: quantize (in0 = x of dtype (code, bits); out0 = q, out1 = absmax);
 * op 1: dequantize (in0 = q, in1 = absmax of n1 elements; out0 = out). */
__attribute__((visibility("default"))) int quant_shim_call(int op, void* in0, int code, int bits, long long n,
                                                           void* in1, long long n1, void* out0, void* out1,
                                                           long long blocksize, char* err, int err_len) {
    int64_t shape0[1] = {n}, shape1[1] = {n1}, nb[1] = {0};
    cuplug_tensor in[2] = {{in0, CUPLUG_DEVICE_CPU, 0, 1, {(uint8_t)code, (uint8_t)bits, 1}, shape0, NULL, 0},
                           {in1, CUPLUG_DEVICE_CPU, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, shape1, NULL, 0}};
    cuplug_tensor out[2] = {{out0, CUPLUG_DEVICE_CPU, 0, 1, {0, 8, 1}, shape0, NULL, 0},
                            {out1, CUPLUG_DEVICE_CPU, 0, 1, {CUPLUG_DTYPE_FLOAT, 32, 1}, nb, NULL, 0}};
    cuplug_attr attr = {"blocksize", CUPLUG_ATTR_INT64, {.i = blocksize}};
    cuplug_call c = {&cuplug_ops[op], in, op == 0 ? 1 : 2, out, op == 0 ? 2 : 1, &attr, 1, n, NULL, 0, NULL, err,
                     (size_t)err_len};
    err[0] = '\0';
    return cuplug_ops[op].fn(&c);
}
