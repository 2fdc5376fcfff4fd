# expect: tampering  problem: problems/mul_add_small.py
# Tries: finding the timing clock through the garbage collector and pointing its L2 flush at a tiny buffer, so that every timed run starts with its inputs in the L2 cache.
import gc

import torch
import triton
import triton.language as tl


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


def _mul_add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _mul_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def _swap():
    tiny = torch.zeros(1, dtype=torch.int32, device="cuda")
    for obj in gc.get_objects():
        fields = getattr(type(obj), "__dataclass_fields__", None)
        if isinstance(fields, dict) and "flush" in fields and "elapsed" in fields:
            for cell in obj.flush.__closure__ or ():
                if isinstance(cell.cell_contents, torch.Tensor):
                    cell.cell_contents = tiny


_swap()


def triton_fused_operator(tensor_0, tensor_1):
    return [_mul_add(tensor_0, tensor_1)]
