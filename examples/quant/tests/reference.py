"""The NumPy reference of quantkit's two ops: the formulas of README.md, op by op in float32.

bfloat16 travels as its uint16 bit patterns (NumPy has no bfloat16): ``bf16_bits_to_f32``
widens them exactly, ``f32_to_bf16_bits`` rounds float32 to bfloat16 (nearest even).
"""

from __future__ import annotations

import numpy as np

F32_127 = np.float32(127.0)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(x)
    return np.where(nan, 0x7FC0, rounded).astype(np.uint16)


def _blocks(xf: np.ndarray, blocksize: int) -> np.ndarray:
    n = xf.size
    nb = -(-n // blocksize)
    pad = np.zeros(nb * blocksize, np.float32)
    pad[:n] = xf
    return pad.reshape(nb, blocksize)


def quantize(xf: np.ndarray, blocksize: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 shaped like xf, absmax float32 (ceil(n / blocksize),)) for float32 values xf."""
    xf = np.ascontiguousarray(xf, dtype=np.float32)
    n = xf.size
    blocks = _blocks(xf.ravel(), blocksize)
    m = (blocks.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=1, initial=0)
    m = np.where(m > 0x7F800000, np.uint32(0x7FC00000), m).astype(np.uint32)
    absmax = m.view(np.float32)
    with np.errstate(all="ignore"):
        scale = (F32_127 / absmax).astype(np.float32)
        p = (blocks * scale[:, None]).astype(np.float32)
        nan = np.isnan(p)
        q = np.rint(np.clip(p, -127.0, 127.0))
        q[nan] = 0
    return q.astype(np.int8).ravel()[:n].reshape(xf.shape), absmax


def dequantize(q: np.ndarray, absmax: np.ndarray, blocksize: int = 256) -> np.ndarray:
    """float32 shaped like q: float32(q_i) * (absmax[b] / 127), NaN as 0x7FC00000."""
    q = np.ascontiguousarray(q, dtype=np.int8)
    with np.errstate(all="ignore"):
        dscale = (np.asarray(absmax, np.float32).ravel() / F32_127).astype(np.float32)
        out = (q.ravel().astype(np.float32) * np.repeat(dscale, blocksize)[: q.size]).astype(np.float32)
    out[np.isnan(out)] = np.uint32(0x7FC00000).view(np.float32)
    return out.reshape(q.shape)
