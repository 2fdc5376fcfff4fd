import torch
import torch.nn as nn


class Model(nn.Module):
    """A transposed convolution that doubles height and width."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


batch_size = 8
in_channels = 32
out_channels = 16
height = 24
width = 24


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels]
