import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3D convolution without padding (valid), no bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 4
in_channels = 4
out_channels = 8
kernel_size = 3
depth = 12
height = 24
width = 24


def get_inputs():
    x = torch.randn(batch_size, in_channels, depth, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
