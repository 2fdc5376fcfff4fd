# expect: disallowed_code  problem: problems/elementwise.py
# Tries: a home-made `triton` object whose `jit` looks like Triton's to a source scan; the "kernel" is PyTorch.
import torch


class _NotTriton:
    @staticmethod
    def jit(fn):
        class _Launcher:
            def __getitem__(self, grid):
                return fn

        return _Launcher()


triton = _NotTriton()


@triton.jit
def _sigmoid_mul_kernel(x, y):
    return torch.sigmoid(x) * y


def triton_fused_operator(tensor_0, tensor_1):
    return [_sigmoid_mul_kernel[(1,)](tensor_0, tensor_1)]
