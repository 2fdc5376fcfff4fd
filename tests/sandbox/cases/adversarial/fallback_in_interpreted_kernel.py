# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: calling PyTorch from inside a @triton.jit body, which Triton's CPU interpreter runs as plain Python (a GPU compile would reject it).
import torch
import triton
import triton.language as tl

_PENDING = {}


def _host_compute():
    a, b, out = _PENDING.pop("args")
    out.copy_(torch.relu(torch.matmul(a, b)))


@triton.jit
def _kernel(a_ptr, n, BLOCK: tl.constexpr):
    _host_compute()
    offs = tl.arange(0, BLOCK)
    tl.load(a_ptr + offs, mask=offs < n)


def triton_fused_operator(tensor_0, tensor_1):
    out = torch.empty((tensor_0.shape[0], tensor_1.shape[1]), device=tensor_0.device, dtype=tensor_0.dtype)
    _PENDING["args"] = (tensor_0, tensor_1, out)
    _kernel[(1,)](tensor_0, tensor_0.numel(), BLOCK=16)
    return [out]
