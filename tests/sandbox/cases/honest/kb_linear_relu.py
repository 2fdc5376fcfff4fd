# expect: correct  problem: problems/kb_linear_relu.py
# Honest (KernelBench format): ModelNew keeps the Linear's parameters and runs x @ W^T + b, ReLU, scale in one kernel.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_relu_scale_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
    sxm, sxk, swn, swk, som, son, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        x = tl.load(
            x_ptr + rm[:, None] * sxm + ks[None, :] * sxk,
            mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0,
        )
        # W is [N, K]; read it as [K, N] through its strides.
        w = tl.load(
            w_ptr + ks[:, None] * swk + rn[None, :] * swn,
            mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0,
        )
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    acc = tl.maximum(acc + bias[None, :], 0.0) * scale
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * som + rn[None, :] * son, acc, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # same parameters, same init order
        self.scale = scale

    def forward(self, x):
        weight, bias = self.linear.weight, self.linear.bias
        M, K = x.shape
        N = weight.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 16
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        _linear_relu_scale_kernel[grid](
            x, weight, bias, out, M, N, K,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            out.stride(0), out.stride(1), float(self.scale),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        )
        return out
