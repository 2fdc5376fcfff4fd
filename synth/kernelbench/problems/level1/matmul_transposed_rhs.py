import torch
import torch.nn as nn


class Model(nn.Module):
    """A @ B.T, with B stored as (N, K)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B.t())


M = 384
K = 512
N = 256


def get_inputs():
    A = torch.randn(M, K)
    B = torch.randn(N, K)
    return [A, B]


def get_init_inputs():
    return []
