# expect: correct  problem: kernelbench_honest/problems/bmm_tanh.py
# Honest (KernelBench): a 3-D launch grid (tiles x tiles x batch), tanh from exp in the epilogue, do_not_specialize on the batch stride.
from typing import Tuple

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 16
BLOCK_K = 16


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit(do_not_specialize=["stride_ab"])
def bmm_tanh_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_base = a_ptr + batch * stride_ab
    b_base = b_ptr + batch * stride_bb
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(
            a_base + rm[:, None] * stride_am + kk[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_base + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision="ieee")
    out = _tanh(acc)
    c_ptrs = c_ptr + batch * stride_cb + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, out, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _grid(batch: int, m: int, n: int) -> Tuple[int, int, int]:
    return (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N), batch)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        B, M, K = a.shape
        B2, K2, N = b.shape
        assert B == B2 and K == K2, "shape mismatch"
        c = torch.empty((B, M, N), device=a.device, dtype=a.dtype)
        bmm_tanh_kernel[_grid(B, M, N)](
            a,
            b,
            c,
            M,
            N,
            K,
            a.stride(0),
            a.stride(1),
            a.stride(2),
            b.stride(0),
            b.stride(1),
            b.stride(2),
            c.stride(0),
            c.stride(1),
            c.stride(2),
            BM=BLOCK_M,
            BN=BLOCK_N,
            BK=BLOCK_K,
        )
        return c
