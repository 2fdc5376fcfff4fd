# expect: no_triton_kernel  problem: problems/elementwise.py
# Tries: plain PyTorch, no Triton at all.
import torch


def triton_fused_operator(tensor_0, tensor_1):
    return [torch.sigmoid(tensor_0) * tensor_1]
