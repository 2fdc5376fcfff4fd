import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolution, ReLU, then a learned per-channel bias added after the activation."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.post_bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x))
        return x + self.post_bias


batch_size = 8
in_channels = 8
out_channels = 32
kernel_size = 3
height = 40
width = 40


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
