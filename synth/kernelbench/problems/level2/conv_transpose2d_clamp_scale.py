import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed convolution, clamp to [-1, 1], then a constant scale."""

    def __init__(self, in_channels: int, out_channels: int, scale: float):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 3, stride=2, padding=1)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp(self.up(x), min=-1.0, max=1.0)
        return x * self.scale


batch_size = 8
in_channels = 32
out_channels = 16
height = 16
width = 16
scale = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, scale]
