import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolution, 2x2 max pooling, sigmoid, then a sum over the spatial dims."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(self.pool(self.conv(x)))
        return torch.sum(x, dim=[2, 3])


batch_size = 8
in_channels = 8
out_channels = 16
height = 34
width = 34


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
