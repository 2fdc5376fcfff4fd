# expect: torch_fallback  problem: problems/elementwise.py
# Tries: PyTorch called from a helper inside a @triton.jit body, which Triton's CPU interpreter runs as plain Python (with the launch's own tensor copies allowed).
# Class: 3  caught-without-gate: runtime
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _probe_kernel(flag_ptr):
    tl.store(flag_ptr, 1.0)


def _copy(src):
    """A real Triton launch: the call's answer flows through a kernel."""
    dst = torch.empty_like(src)
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
    return dst


_PENDING = {}


def _host_compute():
    x, y, out = _PENDING.pop("args")
    out.copy_(torch.sigmoid(x) * y)


@triton.jit
def _kernel(x_ptr, n, BLOCK: tl.constexpr):
    _host_compute()
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)


def triton_fused_operator(tensor_0, tensor_1):
    out = torch.empty_like(tensor_0)
    _PENDING["args"] = (tensor_0, tensor_1, out)
    _kernel[(1,)](tensor_0, tensor_0.numel(), BLOCK=16)
    return [out]
