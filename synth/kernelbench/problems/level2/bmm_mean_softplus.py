import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Batched product, mean over the rows, softplus."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.softplus(torch.bmm(a, b).mean(dim=1))


batch = 32
m = 128
k = 64
n = 128


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []
