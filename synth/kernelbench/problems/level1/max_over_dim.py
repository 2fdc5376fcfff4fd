import torch
import torch.nn as nn


class Model(nn.Module):
    """Max over dim 1 (values only)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=1)[0]


batch_size = 32
rows = 256
cols = 256


def get_inputs():
    x = torch.randn(batch_size, rows, cols)
    return [x]


def get_init_inputs():
    return []
