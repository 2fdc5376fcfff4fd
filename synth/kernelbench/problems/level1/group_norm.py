import torch
import torch.nn as nn


class Model(nn.Module):
    """GroupNorm with 8 groups and per-channel affine weights."""

    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


batch_size = 8
groups = 8
channels = 64
height = 32
width = 32


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [groups, channels]
