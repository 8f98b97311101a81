/*
 * Pins the glibc symbols that newer glibcs version anew to the versions of manylinux_2_17's floor, so a CPU twin
 * (or a CUDA variant's host code) that calls expf() or log() links against the old entry, and the wheel stays
 * manylinux_2_17 whatever glibc builds it. cuplug_add_cpu_backend() and cuplug_add_cuda_backend() force-include
 * this file (-include); nothing needs to include it by hand.
 *
 * The table: every symbol of libm.so.6 and libc.so.6 whose default version is newer than GLIBC_2.17 while an
 * older version is still exported, read from the pinned bullseye sysroots (glibc 2.31, x86_64 and aarch64;
 * tests/test_glibc_floor.py keeps this list equal to theirs). The old entries are the same functions, older
 * implementations (expf@GLIBC_2.2.5 is glibc 2.26's expf: correctly rounded in the same cases, some
 * nanoseconds slower); lgamma's old entry sets signgam as C99 asks, glob's takes the old GLOB_ALTDIRFUNC layout.
 * A symbol that has no old version (it did not exist in 2.17) cannot be pinned: the shipping gate names it.
 */
#ifndef CUPLUG_GLIBC_FLOOR_H
#define CUPLUG_GLIBC_FLOOR_H
#if defined(__linux__) && !defined(__CUDA_ARCH__) && !defined(CUPLUG_NO_GLIBC_FLOOR)
#if defined(__x86_64__)
#define CUPLUG_GLIBC_OLD "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define CUPLUG_GLIBC_OLD "GLIBC_2.17"
#endif
#ifdef CUPLUG_GLIBC_OLD
#define CUPLUG_PIN(sym) __asm__(".symver " #sym "," #sym "@" CUPLUG_GLIBC_OLD);
/* libm: the exp/log/pow families (new in 2.27 for float, 2.29 for double), lgamma (2.23) */
CUPLUG_PIN(exp) CUPLUG_PIN(exp2) CUPLUG_PIN(log) CUPLUG_PIN(log2) CUPLUG_PIN(pow)
CUPLUG_PIN(expf) CUPLUG_PIN(exp2f) CUPLUG_PIN(logf) CUPLUG_PIN(log2f) CUPLUG_PIN(powf)
CUPLUG_PIN(lgamma) CUPLUG_PIN(lgammaf) CUPLUG_PIN(lgammal)
/* libc */
CUPLUG_PIN(glob) CUPLUG_PIN(glob64) CUPLUG_PIN(fmemopen)
#undef CUPLUG_PIN
#endif
#endif
#endif
