import torch
import torch.nn as nn


class Model(nn.Module):
    """A tall matrix times a wide one: (M, K) @ (K, N) with small K."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return A @ B


M = 2048
K = 32
N = 768


def get_inputs():
    A = torch.randn(M, K)
    B = torch.randn(K, N)
    return [A, B]


def get_init_inputs():
    return []
