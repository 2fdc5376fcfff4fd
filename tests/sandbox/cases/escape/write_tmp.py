# expect: correct|runtime_error|tampering|disallowed_code  problem: problems/elementwise.py
# Tries: a correct kernel that also writes a file under the host's /tmp, outside its job directory (path filled in by the test).
import torch
import triton
import triton.language as tl

TARGET = "@@PATH@@"


def _leave_a_file():
    try:
        with open(TARGET, "w") as handle:
            handle.write("escaped from the sandbox\n")
        print(f"wrote {TARGET}", flush=True)
    except OSError as error:
        print(f"could not write {TARGET}: {error}", flush=True)


_leave_a_file()


@triton.jit
def _sigmoid_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, y / (1.0 + tl.exp(-x)), mask=mask)


def _sigmoid_mul(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _sigmoid_mul_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    _leave_a_file()
    return [_sigmoid_mul(tensor_0, tensor_1)]
