import torch
import torch.nn as nn


class Model(nn.Module):
    """InstanceNorm2d without affine weights."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 8
channels = 16
height = 64
width = 64


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [channels]
