import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix multiplication with torch.bmm."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


batch = 16
m = 128
k = 64
n = 96


def get_inputs():
    A = torch.randn(batch, m, k)
    B = torch.randn(batch, k, n)
    return [A, B]


def get_init_inputs():
    return []
