# expect: syntax_error  problem: problems/elementwise.py
# Tries: a candidate that does not parse (unclosed bracket, missing colon).
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def triton_fused_operator(tensor_0, tensor_1):
    return [tensor_0]
