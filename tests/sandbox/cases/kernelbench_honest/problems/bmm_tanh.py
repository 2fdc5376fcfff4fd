import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matmul followed by tanh."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.tanh(torch.bmm(a, b))


batch = 3
m = 18
k = 24
n = 20


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []
