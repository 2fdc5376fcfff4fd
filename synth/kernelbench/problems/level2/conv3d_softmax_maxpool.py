import torch
import torch.nn as nn


class Model(nn.Module):
    """3D convolution, softmax over channels, 2x2x2 max pooling."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3, padding=1)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.softmax(self.conv(x), dim=1)
        return self.pool(x)


batch_size = 4
in_channels = 4
out_channels = 8
depth = 8
height = 16
width = 16


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
