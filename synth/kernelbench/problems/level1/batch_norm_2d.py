import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm2d on batch statistics (training mode, as constructed)."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


batch_size = 16
channels = 32
height = 32
width = 32


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [channels]
