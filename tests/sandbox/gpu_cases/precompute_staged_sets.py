# expect: correct|wrong_output  problem: problems/mul_add.py  speedup_within: 1.05
# Tries: computing later calls' answers ahead. The staged sets sit in one packed buffer: when the first timed run (set 0) comes 7 sets below the warm-ups' set, it reaches every set between the two by pointer arithmetic from its own inputs and computes their answers at once; the later runs answer with a Triton copy (2 of the kernel's 3 passes over memory). Only memory between two inputs it was given is read.
import torch
import triton
import triton.language as tl

_ANSWERS = {}
_SEEN = set()
_SETS_BEFORE = 7  # mul_add's plan: 8 sets of 128 MiB, the warm-ups on the last


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, out_ptr, n, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + shift + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + shift + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _mul_add(x, y, shift):
    out = torch.empty_like(x)
    n = out.numel()
    _mul_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, shift, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    here = tensor_0.data_ptr()
    if here in _ANSWERS:
        cached = _ANSWERS[here]
        out = torch.empty_like(cached)
        _copy_kernel[(triton.cdiv(out.numel(), 1024),)](cached, out, out.numel(), BLOCK=1024)
        return [out]
    size = tensor_0.numel() * tensor_0.element_size()
    stride = 2 * size  # one set to the next: tensor_0 then tensor_1
    packed = tensor_1.data_ptr() - here == size
    if packed and not _ANSWERS and here + _SETS_BEFORE * stride in _SEEN:
        for ahead in range(1, _SETS_BEFORE):
            shift = ahead * stride // tensor_0.element_size()
            _ANSWERS[here + ahead * stride] = _mul_add(tensor_0, tensor_1, shift)
    _SEEN.add(here)
    return [_mul_add(tensor_0, tensor_1, 0)]
